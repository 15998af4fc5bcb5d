//! The defaults the help shows, rendered from the libraries' own
//! (`RunOptions::default()`, `SignalOptions::default()`, the policy host's
//! and the check's, the fleet's constants), so that each value is written
//! in one place; the tests below check that every default the help
//! documents is the one a run gets.

use std::time::Duration;

/// A default as clap shows and parses it, rendered once from the value
/// `$text` makes (clap keeps `&'static str`s).
macro_rules! shown {
    ($text:expr) => {{
        static SHOWN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        SHOWN.get_or_init(|| $text).as_str()
    }};
}

/// `10m`, `30s`, `0s`: a duration as the duration flags read it.
pub fn duration(value: Duration) -> String {
    humantime::format_duration(value).to_string()
}

/// `64MiB`: a size in the largest binary unit that divides it, as
/// `--policy-max-size` reads it.
pub fn size(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        let one: u64 = 1 << shift;
        if bytes >= one && bytes.is_multiple_of(one) {
            return format!("{}{unit}", bytes / one);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};
    use nyann_check::CheckSettings;
    use nyann_load::RunOptions;
    use nyann_model::{Step, parse_duration};
    use nyann_policy_host::HostConfig;
    use nyann_run::PolicySource;
    use nyann_signals::SignalOptions;

    use super::super::{Cli, Command, generate, progress};
    use super::*;

    fn generate(args: &[&str]) -> generate::Args {
        let argv = ["nyann-bench", "generate"].iter().chain(args);
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: Command::Generate(args),
                ..
            }) => args,
            other => panic!("generate does not parse: {other:?}"),
        }
    }

    /// The help of `command`'s flag `--long`.
    fn help_of(command: &clap::Command, long: &str) -> String {
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_long() == Some(long))
            .unwrap_or_else(|| panic!("no --{long}"));
        let help = arg.get_long_help().or(arg.get_help());
        help.map(ToString::to_string).unwrap_or_default()
    }

    /// What the help of `--long` says its default is: `[default: X]`,
    /// up to a comma.
    fn documented(command: &clap::Command, long: &str) -> String {
        let help = help_of(command, long);
        let start = help
            .find("[default: ")
            .unwrap_or_else(|| panic!("--{long} documents no default: {help}"));
        let rest = &help[start + "[default: ".len()..];
        let end = rest.find([',', ']']).unwrap_or(rest.len());
        rest[..end].to_string()
    }

    #[test]
    fn sizes_and_durations_read_as_the_flags_write_them() {
        assert_eq!(size(64 << 20), "64MiB");
        assert_eq!(size(3 << 30), "3GiB");
        assert_eq!(size(1536), "1536");
        assert_eq!(size(1000), "1000");
        for text in ["10m", "30s", "0s", "1m", "5m", "3s", "250ms"] {
            let value = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&duration(value)).unwrap(), value, "{text}");
        }
    }

    /// `generate` without a flag runs with the libraries' defaults: each
    /// default clap shows, parsed back, is the library's value. (Values
    /// that come from the environment, the seed and the proxies, aside.)
    #[test]
    fn generate_without_flags_runs_with_the_libraries_defaults() {
        let args = generate(&[]);
        let spec = args.spec(None).unwrap();

        let (load, library) = (&spec.load, RunOptions::default());
        assert_eq!(load.client.api, library.client.api);
        assert_eq!(load.client.stream_usage, library.client.stream_usage);
        assert_eq!(
            load.client.length_extensions,
            library.client.length_extensions
        );
        assert_eq!(load.client.headers, library.client.headers);
        assert_eq!(load.client.request_timeout, library.client.request_timeout);
        assert!(load.client.ca_certs.is_empty());
        assert_eq!(load.target, library.target);
        assert_eq!(load.model, library.model);
        assert_eq!(load.max_consecutive_errors, library.max_consecutive_errors);
        assert_eq!(load.ready_timeout, library.ready_timeout);
        assert_eq!(load.grace, library.grace);
        assert_eq!(load.drain_timeout, library.drain_timeout);
        assert_eq!(load.output_dir, None);

        let (signals, library) = (&spec.signals, SignalOptions::default());
        assert_eq!(signals.prometheus_url, library.prometheus_url);
        assert_eq!(signals.deploy_name, library.deploy_name);
        assert_eq!(signals.selectors, library.selectors);
        assert_eq!(signals.scrape, library.scrape);
        assert_eq!(signals.scrape_interval, library.scrape_interval);
        assert_eq!(signals.scrape_timeout, library.scrape_timeout);
        assert_eq!(signals.settle, library.settle);
        assert_eq!(signals.settle_wait, library.settle_wait);
        assert_eq!(signals.prometheus_timeout, library.prometheus_timeout);
        assert_eq!(signals.prometheus_headers, library.prometheus_headers);
        assert_eq!(signals.server, library.server);
        assert_eq!(signals.metrics, library.metrics);
        assert_eq!(signals.allow_missing_signals, library.allow_missing_signals);
        assert_eq!(
            signals.prometheus_client_cert,
            library.prometheus_client_cert
        );

        let policy = &spec.policy;
        assert!(matches!(policy.source, PolicySource::Builtin));
        let settings = CheckSettings::default();
        assert_eq!(policy.settings.mode, settings.mode);
        assert_eq!(policy.settings.on_error, settings.on_error);
        assert_eq!(
            policy.settings.server_drain_wait,
            settings.server_drain_wait
        );
        let host = HostConfig::default();
        assert_eq!(policy.host.judge_fuel, host.judge_fuel);
        assert_eq!(policy.host.call_timeout, host.call_timeout);
        assert_eq!(policy.host.max_component_bytes, host.max_component_bytes);

        assert_eq!(spec.output, None);
        assert_eq!(spec.client_metrics, None);
        assert!(spec.lead.is_none());
        assert_eq!(args.progress_interval, progress::DEFAULT_INTERVAL);
        assert_eq!(
            args.fleet.heartbeat_timeout,
            nyann_run::fleet::HEARTBEAT_TIMEOUT
        );
        assert_eq!(args.fleet.join_timeout, nyann_run::fleet::JOIN_TIMEOUT);
    }

    /// The defaults the help writes in words (optional flags, whose
    /// absence the code sees) are the ones the code takes.
    #[test]
    fn the_defaults_written_in_the_help_are_the_ones_taken() {
        let cli = Cli::command();
        let command = cli.find_subcommand("generate").unwrap();
        let scenario = generate(&[]).single.scenario().unwrap();
        let [Step::Stage(stage)] = scenario.steps.as_slice() else {
            panic!("one stage: {:?}", scenario.steps);
        };
        let number = |long| documented(command, long).parse::<u32>().unwrap();
        assert_eq!(
            parse_duration(&documented(command, "duration")).unwrap(),
            Duration::from_secs_f64(stage.duration_s)
        );
        assert_eq!(Some(number("concurrency")), stage.concurrency);
        assert_eq!(number("isl"), scenario.workload.isl);
        assert_eq!(number("osl"), scenario.workload.osl);
        assert_eq!(number("turns"), scenario.workload.turns);
        assert_eq!(documented(command, "mode"), "concurrent");
        assert_eq!(stage.mode, nyann_model::Mode::Concurrent);
        assert_eq!(
            documented(command, "workload"),
            serde_json::to_value(scenario.workload.kind).unwrap()
        );
        assert!(help_of(command, "target").contains(nyann_load::DEFAULT_TARGET));
        let listen = format!("0.0.0.0:{}", nyann_run::fleet::COORDINATOR_PORT);
        assert_eq!(documented(command, "coordinator-listen"), listen);
        let kube = cli.find_subcommand("kube").unwrap();
        let render = kube.find_subcommand("render").unwrap();
        let port = render
            .get_arguments()
            .find(|arg| arg.get_long() == Some("port"))
            .unwrap();
        let port: Vec<String> = port
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        assert_eq!(port, [nyann_run::fleet::COORDINATOR_PORT.to_string()]);
    }
}
