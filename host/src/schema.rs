//! The JSON Schema of the files a run writes (`docs/schema/`), generated
//! from the types that write them. Users' pipelines validate against it; a
//! test keeps the committed files equal to what the code generates, and
//! the end-to-end tests validate real runs (one process and a fleet)
//! against them.

use nyann_fleet::merge::StageFleet;
use nyann_load::RequestRecord;
use schemars::{JsonSchema, Schema};

use nyann_check::CongestionRecord;
use nyann_check::conclusion::Summary;

/// A stage's `annotation` as the files hold it: the congestion check's
/// record and, in the files of several workers, the fleet's part.
#[derive(serde::Serialize, JsonSchema)]
#[allow(dead_code)] // described, never built
struct Annotation {
    /// What the congestion check recorded (judged stages only).
    #[serde(skip_serializing_if = "Option::is_none")]
    congestion: Option<CongestionRecord>,
    /// How the fleet ran the stage (runs of several workers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet: Option<StageFleet>,
}

/// One line of `requests.jsonl`.
#[derive(serde::Serialize, JsonSchema)]
#[allow(dead_code)]
struct RequestLine {
    #[serde(flatten)]
    record: RequestRecord,
    /// The worker that sent it (runs of several workers only; 0 is the leader).
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<usize>,
}

type Run = nyann_load::RunResult<Annotation>;
type Stage = nyann_load::StageResult<Annotation>;

/// Each file's name under `docs/schema/` and its schema: what the files
/// hold as written (a field left out when empty is not required).
pub fn schemas() -> [(&'static str, Schema); 3] {
    fn of<T: JsonSchema>() -> Schema {
        schemars::generate::SchemaSettings::draft2020_12()
            .for_serialize()
            .into_generator()
            .into_root_schema_for::<T>()
    }
    [
        (
            "stages.schema.json",
            of::<nyann_results::StagesFile<'static, Stage>>(),
        ),
        (
            "summary.schema.json",
            of::<nyann_results::SummaryFile<'static, Summary<'static, Run>>>(),
        ),
        ("request.schema.json", of::<RequestLine>()),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// Fails when a change to the types changed the files' shape without
    /// the committed schema (and, for a change users' pipelines notice,
    /// `nyann_results::SCHEMA_VERSION`) following.
    #[test]
    fn the_committed_schema_is_the_one_the_types_give() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema");
        let bless = std::env::var_os("NYANN_BLESS").is_some();
        for (name, schema) in super::schemas() {
            let path = dir.join(name);
            let generated = serde_json::to_string_pretty(&schema).unwrap() + "\n";
            if bless {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &generated).unwrap();
                continue;
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == generated,
                "{} is not the schema the types give: if the change is meant, raise \
                 nyann_results::SCHEMA_VERSION when users' pipelines would notice it, then \
                 write the schema again with `NYANN_BLESS=1 cargo test --release -p nyann-bench \
                 --bin nyann-bench schema` and commit it",
                path.display()
            );
        }
    }
}
