//! Where the pods find the policy: its bytes in the ConfigMap (at most
//! 1 MiB with the scenario), a registry's component mounted as an image
//! volume pinned by digest (Kubernetes' KEP-4639, beta since 1.33), or,
//! on clusters without image volumes, pulled by the leader itself.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ImageVolumeSource, Volume, VolumeMount};

use crate::CONFIG_DIR;

/// Where an image volume with the policy is mounted.
pub const POLICY_DIR: &str = "/etc/nyann-bench-policy";
/// The component's file name: in the ConfigMap, and in an image volume the
/// title `nyann-bench policy push` gives its layer.
pub const POLICY_FILE: &str = "policy.wasm";

/// How the policy reaches the pods.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyDelivery {
    /// The component's bytes, in the ConfigMap.
    Inline(Vec<u8>),
    /// A component in a registry mounted read-only as an image volume:
    /// `REGISTRY/REPO@sha256:...`, pinned by digest (the kubelet pulls it
    /// with the pod's image pull secrets).
    ImageVolume { image: String },
    /// A component the leader pulls itself at start, for clusters without
    /// image volumes: `oci://REGISTRY/REPO@sha256:...` (the pod needs the
    /// registry's network and, if private, credentials of its own).
    Pull { reference: String },
}

impl PolicyDelivery {
    /// The bytes it adds to the ConfigMap.
    pub(crate) fn config_map_bytes(&self) -> usize {
        match self {
            PolicyDelivery::Inline(wasm) => wasm.len(),
            _ => 0,
        }
    }

    /// Its entry in the ConfigMap's `binaryData`, if it travels there.
    pub(crate) fn binary_data(&self) -> Option<BTreeMap<String, ByteString>> {
        match self {
            PolicyDelivery::Inline(wasm) => Some(BTreeMap::from([(
                POLICY_FILE.to_string(),
                ByteString(wasm.clone()),
            )])),
            _ => None,
        }
    }

    /// The `--policy` value of the pods' command.
    pub(crate) fn policy_arg(&self) -> String {
        match self {
            PolicyDelivery::Inline(_) => format!("{CONFIG_DIR}/{POLICY_FILE}"),
            PolicyDelivery::ImageVolume { .. } => format!("{POLICY_DIR}/{POLICY_FILE}"),
            PolicyDelivery::Pull { reference } => reference.clone(),
        }
    }

    /// The image volume and its mount, for [`PolicyDelivery::ImageVolume`].
    pub(crate) fn volume(&self) -> Option<(Volume, VolumeMount)> {
        let PolicyDelivery::ImageVolume { image } = self else {
            return None;
        };
        Some((
            Volume {
                name: "policy".into(),
                image: Some(ImageVolumeSource {
                    reference: Some(image.clone()),
                    // Pinned by digest: what is on the node is what was named.
                    pull_policy: Some("IfNotPresent".into()),
                }),
                ..Volume::default()
            },
            VolumeMount {
                name: "policy".into(),
                mount_path: POLICY_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_delivery_puts_the_policy_where_the_command_looks() {
        let inline = PolicyDelivery::Inline(b"\0asm".to_vec());
        assert_eq!(inline.config_map_bytes(), 4);
        assert!(inline.binary_data().unwrap().contains_key(POLICY_FILE));
        assert_eq!(inline.policy_arg(), "/etc/nyann-bench/policy.wasm");
        assert!(inline.volume().is_none());

        let image = "registry.example.com/team/slo@sha256:00".to_string();
        let mounted = PolicyDelivery::ImageVolume {
            image: image.clone(),
        };
        assert_eq!(mounted.config_map_bytes(), 0);
        assert!(mounted.binary_data().is_none());
        let (volume, mount) = mounted.volume().unwrap();
        assert_eq!(volume.image.unwrap().reference, Some(image));
        assert_eq!(
            mounted.policy_arg(),
            format!("{}/{POLICY_FILE}", mount.mount_path)
        );

        let reference = "oci://registry.example.com/team/slo@sha256:00".to_string();
        let pulled = PolicyDelivery::Pull {
            reference: reference.clone(),
        };
        assert_eq!(pulled.policy_arg(), reference);
        assert!(pulled.volume().is_none() && pulled.binary_data().is_none());
    }
}
