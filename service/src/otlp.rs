//! Where OTLP exports go, for traces (the `traces` module) and metrics
//! (`telemetry`): `telemetry.*` first, then the standard
//! `OTEL_EXPORTER_OTLP_*` variables, as every OpenTelemetry SDK reads them.

use opentelemetry_sdk::Resource;

use crate::config::{OtlpProtocol, TelemetryOptions};

/// What is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// Spans.
    Traces,
    /// Metrics.
    Metrics,
}

impl Signal {
    /// The signal's part of the standard variables' names.
    fn var(self) -> &'static str {
        match self {
            Self::Traces => "TRACES",
            Self::Metrics => "METRICS",
        }
    }

    /// The standard path of the signal over HTTP.
    fn http_path(self) -> &'static str {
        match self {
            Self::Traces => "/v1/traces",
            Self::Metrics => "/v1/metrics",
        }
    }
}

/// Where one signal goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The transport.
    pub(crate) protocol: OtlpProtocol,
    /// The URL to give the exporter; `None` leaves it to the standard
    /// variables (which the exporter reads itself).
    pub(crate) endpoint: Option<String>,
}

/// Where `signal` goes, or `None` when it is not exported: no endpoint in
/// the options or the standard variables, or the signal turned off by
/// `OTEL_SDK_DISABLED=true` or `OTEL_<SIGNAL>_EXPORTER=none`.
pub(crate) fn target(options: &TelemetryOptions, signal: Signal) -> Option<Target> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let signal_var = |suffix: &str| format!("OTEL_EXPORTER_OTLP_{}_{suffix}", signal.var());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var(&format!("OTEL_{}_EXPORTER", signal.var()))
            .is_some_and(|v| v.eq_ignore_ascii_case("none"));
    let from_env =
        var(&signal_var("ENDPOINT")).is_some() || var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    if disabled || (options.otlp_endpoint.is_none() && !from_env) {
        return None;
    }
    // The standard variables choose when the config does not; gRPC, the
    // collectors' usual 4317, when neither does.
    let protocol = options.otlp_protocol.unwrap_or_else(|| {
        match var(&signal_var("PROTOCOL"))
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .as_deref()
        {
            Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
            _ => OtlpProtocol::Grpc,
        }
    });
    let endpoint = options.otlp_endpoint.as_deref().map(|e| match protocol {
        OtlpProtocol::Grpc => e.to_owned(),
        OtlpProtocol::HttpProtobuf => http_url(e, signal.http_path()),
    });
    Some(Target { protocol, endpoint })
}

/// The URL a signal is posted to over HTTP: a collector's base URL gets the
/// signal's standard path, as `OTEL_EXPORTER_OTLP_ENDPOINT` would.
fn http_url(endpoint: &str, path: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let has_path = trimmed
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'));
    if has_path {
        endpoint.to_owned()
    } else {
        format!("{trimmed}{path}")
    }
}

/// The resource of the service `service`: its `service.name`, unless
/// `OTEL_SERVICE_NAME` names it, and `OTEL_RESOURCE_ATTRIBUTES`.
pub(crate) fn resource(service: &str) -> Resource {
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service.to_owned());
    }
    resource.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_endpoints_get_the_signals_path_unless_they_have_one() {
        assert_eq!(
            http_url("http://collector:4318", "/v1/traces"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            http_url("http://collector:4318/", "/v1/metrics"),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            http_url("https://otlp.example/custom/traces", "/v1/traces"),
            "https://otlp.example/custom/traces"
        );
    }

    #[test]
    fn the_config_names_the_target_and_the_protocol_shapes_its_url() {
        // The standard variables are not set in unit tests (the process's
        // environment is shared; the end-to-end tests cover them).
        let off = TelemetryOptions::default();
        assert_eq!(target(&off, Signal::Traces), None);
        let http = TelemetryOptions {
            otlp_endpoint: Some("http://c:4318".into()),
            otlp_protocol: Some(OtlpProtocol::HttpProtobuf),
            sample_ratio: None,
            ..TelemetryOptions::default()
        };
        assert_eq!(
            target(&http, Signal::Metrics),
            Some(Target {
                protocol: OtlpProtocol::HttpProtobuf,
                endpoint: Some("http://c:4318/v1/metrics".into()),
            })
        );
    }
}
