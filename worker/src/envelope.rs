//! The one place a [`ToolError`] becomes the envelope the model sees.

use toolfleet_proto::{Envelope, ErrorBody, ErrorCode};

use crate::tool::ToolError;

/// The generic message of failures whose detail must stay in the log.
pub(crate) const GENERIC_FAILURE: &str =
    "the tool failed unexpectedly; the failure was logged for the operators";

/// Converts a tool's failure into its envelope. Internals never reach the
/// message: [`ToolError::Internal`] gets a generic one.
pub fn from_error(error: &ToolError) -> Envelope {
    let retryable = error.is_retryable();
    let (code, message, retry_after_ms) = match error {
        ToolError::InvalidArguments(message) => {
            (ErrorCode::INVALID_TOOL_ARGUMENTS, message.clone(), None)
        }
        ToolError::UpstreamTimeout(after) => (
            ErrorCode::TOOL_TIMEOUT,
            format!(
                "a service the tool depends on did not answer within {}",
                humantime::format_duration(*after)
            ),
            None,
        ),
        ToolError::RateLimited { retry_after } => (
            ErrorCode::RATE_LIMITED,
            "a service the tool depends on is rate limiting; try again later".to_owned(),
            retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        ),
        ToolError::Coded { code, message, .. } => (code.clone(), message.clone(), None),
        ToolError::Internal(_) => (
            ErrorCode::TOOL_EXECUTION_FAILED,
            GENERIC_FAILURE.to_owned(),
            None,
        ),
    };
    // A tool that cannot tell whether its effect happened says so the way
    // the runtime's own unknown outcomes do (decision 0004).
    let side_effect = (code == ErrorCode::OUTCOME_UNKNOWN).then(|| "unknown".to_owned());
    Envelope::Err(ErrorBody {
        code,
        message,
        retryable,
        retry_after_ms,
        side_effect,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_variant_maps_to_its_envelope() {
        let cases: Vec<(ToolError, &str, bool, Option<u64>)> = vec![
            (
                ToolError::InvalidArguments("location must be at least 2 characters".into()),
                "INVALID_TOOL_ARGUMENTS",
                false,
                None,
            ),
            (
                ToolError::UpstreamTimeout(Duration::from_secs(3)),
                "TOOL_TIMEOUT",
                true,
                None,
            ),
            (
                ToolError::RateLimited {
                    retry_after: Some(Duration::from_millis(1500)),
                },
                "RATE_LIMITED",
                true,
                Some(1500),
            ),
            (
                ToolError::RateLimited { retry_after: None },
                "RATE_LIMITED",
                true,
                None,
            ),
            (
                ToolError::terminal(ErrorCode::custom("LOCATION_NOT_FOUND"), "no such place"),
                "LOCATION_NOT_FOUND",
                false,
                None,
            ),
            (
                ToolError::retryable(ErrorCode::custom("WEATHER_SERVICE_TIMEOUT"), "slow"),
                "WEATHER_SERVICE_TIMEOUT",
                true,
                None,
            ),
            (
                ToolError::Internal(anyhow::anyhow!("password=hunter2 at db.internal:5432")),
                "TOOL_EXECUTION_FAILED",
                false,
                None,
            ),
        ];
        for (error, code, retryable, retry_after_ms) in cases {
            let envelope = from_error(&error);
            let body = envelope.error().expect("an error envelope");
            assert_eq!(body.code.as_str(), code, "{error:?}");
            assert_eq!(body.retryable, retryable, "{error:?}");
            assert_eq!(body.retry_after_ms, retry_after_ms, "{error:?}");
        }
    }

    #[test]
    fn internal_details_never_reach_the_model() {
        let error = ToolError::Internal(anyhow::anyhow!("password=hunter2 at db.internal:5432"));
        let text = from_error(&error).to_json();
        assert!(
            !text.contains("hunter2") && !text.contains("db.internal"),
            "{text}"
        );
    }
}
