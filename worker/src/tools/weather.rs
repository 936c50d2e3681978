//! `get_current_weather`: the current temperature and conditions of a named
//! place.
//!
//! Two backends: a built-in fixture of four cities, so that the local demo works
//! offline, and [Open-Meteo](https://open-meteo.com), which needs no API key.
//! Open-Meteo takes two requests: the geocoding API turns the place name into
//! coordinates, then the forecast API gives the current weather there.

use std::time::Duration;

use anyhow::anyhow;
use reqwest::{StatusCode, Url, header::RETRY_AFTER};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolfleet_proto::{Effects, ErrorCode, ToolManifest};

use crate::tool::{Tool, ToolContext, ToolError};

/// The backend knows no place by that name. Terminal: the model should ask for,
/// or pick, another name.
pub const LOCATION_NOT_FOUND: ErrorCode = ErrorCode::from_static("LOCATION_NOT_FOUND");
/// The weather service did not answer within [`WeatherOptions::timeout`].
/// Retryable.
pub const WEATHER_SERVICE_TIMEOUT: ErrorCode = ErrorCode::from_static("WEATHER_SERVICE_TIMEOUT");
/// The weather service could not be reached or answered with a server error.
/// Retryable.
pub const WEATHER_SERVICE_UNAVAILABLE: ErrorCode =
    ErrorCode::from_static("WEATHER_SERVICE_UNAVAILABLE");

const NAME: &str = "get_current_weather";
const DESCRIPTION: &str = "Get the current weather (temperature and conditions) of a named \
place, such as a city. Use it when the user asks what the weather is like right now somewhere. \
Do not use it for forecasts, past or historical weather, or climate averages: it only knows \
the conditions at this moment.";
/// Room on top of the lookup timeout for the runtime's own timeout, so that a
/// slow service ends in `WEATHER_SERVICE_TIMEOUT` rather than the generic
/// `TOOL_TIMEOUT`.
const ATTEMPT_TIMEOUT_MARGIN: Duration = Duration::from_secs(2);
const MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of the `get_current_weather` tool.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WeatherOptions {
    /// Where the weather comes from. Default: `fixture` (offline, four cities).
    pub backend: WeatherBackend,
    /// Base URL of the Open-Meteo geocoding API, without the `/v1/search` path.
    /// Default: `https://geocoding-api.open-meteo.com`.
    pub geocoding_url: String,
    /// Base URL of the Open-Meteo forecast API, without the `/v1/forecast` path.
    /// Default: `https://api.open-meteo.com`.
    pub forecast_url: String,
    /// How long one whole lookup (geocoding and forecast together) may take.
    /// Default: 3s. The tool's per-attempt timeout is this plus 2s, at least 5s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub timeout: Duration,
}

impl Default for WeatherOptions {
    fn default() -> Self {
        Self {
            backend: WeatherBackend::default(),
            geocoding_url: "https://geocoding-api.open-meteo.com".into(),
            forecast_url: "https://api.open-meteo.com".into(),
            timeout: Duration::from_secs(3),
        }
    }
}

/// Where `get_current_weather` gets its answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeatherBackend {
    /// Fixed weather for Boston, San Francisco, London and Beijing; no network.
    #[default]
    Fixture,
    /// The Open-Meteo geocoding and forecast APIs.
    OpenMeteo,
}

/// Why [`GetCurrentWeather::new`] failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A URL setting is not an absolute `http` or `https` URL. Fix the named key.
    #[error("weather.{key} is not an http(s) URL: {value:?}")]
    InvalidUrl {
        /// The offending setting, such as `geocoding_url`.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// The HTTP client could not be built (for example, no TLS roots). Check the
    /// machine's TLS setup.
    #[error("cannot build the weather HTTP client")]
    HttpClient(#[source] reqwest::Error),
}

/// The `get_current_weather` tool.
#[derive(Debug)]
pub struct GetCurrentWeather {
    backend: Backend,
    attempt_timeout: Duration,
}

#[derive(Debug)]
enum Backend {
    Fixture,
    OpenMeteo(OpenMeteo),
}

impl GetCurrentWeather {
    /// The tool with the given settings. With the Open-Meteo backend it builds
    /// one HTTP client that every call shares.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] when a URL setting is not an http(s) URL, and
    /// [`Error::HttpClient`] when the HTTP client cannot be built.
    pub fn new(options: &WeatherOptions) -> Result<Self, Error> {
        let backend = match options.backend {
            WeatherBackend::Fixture => Backend::Fixture,
            WeatherBackend::OpenMeteo => Backend::OpenMeteo(OpenMeteo::new(options)?),
        };
        Ok(Self {
            backend,
            attempt_timeout: (options.timeout + ATTEMPT_TIMEOUT_MARGIN).max(MIN_ATTEMPT_TIMEOUT),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Unit {
    Celsius,
    Fahrenheit,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Self::Celsius => "celsius",
            Self::Fahrenheit => "fahrenheit",
        }
    }
}

#[derive(Deserialize)]
struct Args {
    location: String,
    unit: Unit,
}

/// The weather at a resolved place, in the unit the caller asked for.
struct Observation {
    location: String,
    temperature: f64,
    conditions: &'static str,
}

impl Tool for GetCurrentWeather {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            NAME,
            DESCRIPTION,
            json!({
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA"
                    },
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["location", "unit"],
                "additionalProperties": false
            }),
        )
        .with_timeout(self.attempt_timeout)
        .with_max_attempts(3)
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        let args: Args = serde_json::from_value(args)
            .map_err(|err| ToolError::InvalidArguments(err.to_string()))?;
        let location = args.location.trim();
        if location.chars().count() < 2 {
            return Err(ToolError::InvalidArguments(
                "location must be at least 2 characters".into(),
            ));
        }
        // Both backends look up a city name; "San Francisco, CA" as a whole
        // matches nothing in Open-Meteo's geocoder.
        let city = location.split(',').next().unwrap_or_default().trim();
        let (observation, source) = match &self.backend {
            Backend::Fixture => (fixture_lookup(city, args.unit), "fixture"),
            Backend::OpenMeteo(api) => (api.lookup(city, args.unit).await?, "open-meteo"),
        };
        let Some(observation) = observation else {
            return Err(ToolError::terminal(
                LOCATION_NOT_FOUND,
                format!(
                    r#"no place named "{location}" was found; try a city name such as "Boston, MA""#
                ),
            ));
        };
        Ok(json!({
            "location": observation.location,
            "temperature": observation.temperature,
            "unit": args.unit.as_str(),
            "conditions": observation.conditions,
            "source": source,
        }))
    }
}

/// Lowercase city, resolved name, temperature in °C, conditions.
const FIXTURE: [(&str, &str, f64, &str); 4] = [
    ("boston", "Boston, MA", 8.0, "partly cloudy"),
    ("san francisco", "San Francisco, CA", 16.5, "fog"),
    ("london", "London, UK", 11.0, "light rain"),
    ("beijing", "Beijing, China", 24.0, "clear"),
];

fn fixture_lookup(city: &str, unit: Unit) -> Option<Observation> {
    let &(_, name, celsius, conditions) = FIXTURE
        .iter()
        .find(|(key, ..)| key.eq_ignore_ascii_case(city))?;
    let temperature = match unit {
        Unit::Celsius => celsius,
        Unit::Fahrenheit => round_to_tenth(celsius * 9.0 / 5.0 + 32.0),
    };
    Some(Observation {
        location: name.into(),
        temperature,
        conditions,
    })
}

fn round_to_tenth(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

#[derive(Debug)]
struct OpenMeteo {
    client: reqwest::Client,
    geocoding_url: Url,
    forecast_url: Url,
    timeout: Duration,
}

#[derive(Deserialize)]
struct GeocodingAnswer {
    /// Open-Meteo leaves the key out when nothing matched.
    #[serde(default)]
    results: Vec<Place>,
}

#[derive(Deserialize)]
struct Place {
    name: String,
    latitude: f64,
    longitude: f64,
    #[serde(default)]
    admin1: Option<String>,
    #[serde(default)]
    country: Option<String>,
}

impl Place {
    /// "Boston, Massachusetts, United States": the model sees which place was
    /// used, in case the geocoder picked a different one than the user meant.
    fn display_name(&self) -> String {
        let mut parts = vec![self.name.as_str()];
        for part in [&self.admin1, &self.country].into_iter().flatten() {
            if !part.is_empty() && !parts.contains(&part.as_str()) {
                parts.push(part);
            }
        }
        parts.join(", ")
    }
}

#[derive(Deserialize)]
struct ForecastAnswer {
    current: Current,
}

#[derive(Deserialize)]
struct Current {
    temperature_2m: f64,
    #[serde(default)]
    weather_code: Option<u16>,
}

/// Which request failed, for logs and internal errors.
#[derive(Debug, Clone, Copy)]
enum Endpoint {
    Geocoding,
    Forecast,
}

impl Endpoint {
    fn as_str(self) -> &'static str {
        match self {
            Self::Geocoding => "geocoding",
            Self::Forecast => "forecast",
        }
    }
}

impl OpenMeteo {
    fn new(options: &WeatherOptions) -> Result<Self, Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(options.timeout)
            .timeout(options.timeout)
            .build()
            .map_err(Error::HttpClient)?;
        Ok(Self {
            client,
            geocoding_url: parse_base_url("geocoding_url", &options.geocoding_url)?,
            forecast_url: parse_base_url("forecast_url", &options.forecast_url)?,
            timeout: options.timeout,
        })
    }

    /// `Ok(None)` when the geocoder knows no such place.
    async fn lookup(&self, city: &str, unit: Unit) -> Result<Option<Observation>, ToolError> {
        // The client's timeout bounds each request; this one bounds the pair,
        // which is what the configured timeout promises.
        match tokio::time::timeout(self.timeout, self.geocode_and_fetch(city, unit)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(self.timed_out(None)),
        }
    }

    async fn geocode_and_fetch(
        &self,
        city: &str,
        unit: Unit,
    ) -> Result<Option<Observation>, ToolError> {
        if city.is_empty() {
            return Ok(None);
        }
        let url = endpoint_url(
            &self.geocoding_url,
            &["v1", "search"],
            &[
                ("name", city),
                ("count", "1"),
                ("language", "en"),
                ("format", "json"),
            ],
        );
        let geocoding: GeocodingAnswer = self.get_json(Endpoint::Geocoding, url).await?;
        let Some(place) = geocoding.results.into_iter().next() else {
            return Ok(None);
        };

        let url = endpoint_url(
            &self.forecast_url,
            &["v1", "forecast"],
            &[
                ("latitude", &place.latitude.to_string()),
                ("longitude", &place.longitude.to_string()),
                ("current", "temperature_2m,weather_code"),
                ("temperature_unit", unit.as_str()),
            ],
        );
        let forecast: ForecastAnswer = self.get_json(Endpoint::Forecast, url).await?;
        Ok(Some(Observation {
            location: place.display_name(),
            temperature: forecast.current.temperature_2m,
            conditions: forecast
                .current
                .weather_code
                .map_or("unknown", wmo_conditions),
        }))
    }

    /// The one place where HTTP failures become tool errors.
    async fn get_json<T: DeserializeOwned>(
        &self,
        endpoint: Endpoint,
        url: Url,
    ) -> Result<T, ToolError> {
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|err| self.transport_error(endpoint, &err))?;
        let status = response.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse().ok())
                .map(Duration::from_secs);
            tracing::warn!(
                endpoint = endpoint.as_str(),
                ?retry_after,
                "weather service rate limited"
            );
            return Err(ToolError::RateLimited { retry_after });
        }
        if status.is_server_error() {
            tracing::warn!(endpoint = endpoint.as_str(), %status, "weather service failed");
            return Err(unavailable());
        }
        if !status.is_success() {
            return Err(ToolError::Internal(anyhow!(
                "weather {} API answered HTTP {status}",
                endpoint.as_str()
            )));
        }
        let body = response
            .bytes()
            .await
            .map_err(|err| self.transport_error(endpoint, &err))?;
        serde_json::from_slice(&body).map_err(|err| {
            ToolError::Internal(anyhow::Error::new(err).context(format!(
                "unexpected weather {} API answer",
                endpoint.as_str()
            )))
        })
    }

    fn transport_error(&self, endpoint: Endpoint, err: &reqwest::Error) -> ToolError {
        if err.is_timeout() {
            self.timed_out(Some(endpoint))
        } else {
            tracing::warn!(endpoint = endpoint.as_str(), error = %err, "weather service unreachable");
            unavailable()
        }
    }

    fn timed_out(&self, endpoint: Option<Endpoint>) -> ToolError {
        tracing::warn!(
            endpoint = endpoint.map(Endpoint::as_str),
            timeout = ?self.timeout,
            "weather service timed out"
        );
        ToolError::retryable(
            WEATHER_SERVICE_TIMEOUT,
            format!(
                "Weather service did not respond within {}",
                spoken_duration(self.timeout)
            ),
        )
    }
}

fn unavailable() -> ToolError {
    ToolError::retryable(
        WEATHER_SERVICE_UNAVAILABLE,
        "Weather service is unavailable right now; try again later",
    )
}

fn parse_base_url(key: &'static str, value: &str) -> Result<Url, Error> {
    let invalid = || Error::InvalidUrl {
        key,
        value: value.into(),
    };
    let url = Url::parse(value).map_err(|_| invalid())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid());
    }
    Ok(url)
}

/// `base` with `segments` appended to its path and `query` as its query string,
/// each part percent-encoded.
fn endpoint_url(base: &Url, segments: &[&str], query: &[(&str, &str)]) -> Url {
    let mut url = base.clone();
    url.path_segments_mut()
        // parse_base_url admitted only http(s) URLs, which always have a path.
        .expect("an http(s) URL can be a base")
        .pop_if_empty()
        .extend(segments);
    url.query_pairs_mut().clear().extend_pairs(query);
    url
}

/// "3 seconds", "1 second", "200 milliseconds": for messages the model reads.
fn spoken_duration(duration: Duration) -> String {
    let plural = |n: u128, unit: &str| format!("{n} {unit}{}", if n == 1 { "" } else { "s" });
    if duration.subsec_nanos() == 0 {
        plural(u128::from(duration.as_secs()), "second")
    } else {
        plural(duration.as_millis(), "millisecond")
    }
}

/// A few words for a WMO weather interpretation code, as Open-Meteo reports it.
fn wmo_conditions(code: u16) -> &'static str {
    match code {
        0 => "clear",
        1 => "mainly clear",
        2 => "partly cloudy",
        3 => "overcast",
        45 | 48 => "fog",
        51 | 53 | 55 => "drizzle",
        56 | 57 => "freezing drizzle",
        61 | 63 | 65 => "rain",
        66 | 67 => "freezing rain",
        71 | 73 | 75 | 77 => "snow",
        80..=82 => "rain showers",
        85 | 86 => "snow showers",
        95 => "thunderstorm",
        96 | 99 => "thunderstorm with hail",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Instant;

    use wiremock::matchers::{method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::*;

    fn fixture() -> GetCurrentWeather {
        GetCurrentWeather::new(&WeatherOptions::default()).unwrap()
    }

    fn open_meteo(base_url: &str, timeout: Duration) -> GetCurrentWeather {
        GetCurrentWeather::new(&WeatherOptions {
            backend: WeatherBackend::OpenMeteo,
            geocoding_url: base_url.into(),
            forecast_url: base_url.into(),
            timeout,
        })
        .unwrap()
    }

    async fn ask(tool: &GetCurrentWeather, location: &str, unit: &str) -> Result<Value, ToolError> {
        tool.call(
            json!({"location": location, "unit": unit}),
            ToolContext::for_test(),
        )
        .await
    }

    /// Code, message and retryability of a coded error; panics on anything else.
    fn coded(result: Result<Value, ToolError>) -> (ErrorCode, String, bool) {
        match result {
            Err(ToolError::Coded {
                code,
                message,
                retryable,
            }) => (code, message, retryable),
            other => panic!("expected a coded error, got {other:?}"),
        }
    }

    fn boston_geocoding() -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_json(json!({
            "results": [{
                "name": "Boston", "latitude": 42.35843, "longitude": -71.05977,
                "country": "United States", "admin1": "Massachusetts", "country_code": "US"
            }],
            "generationtime_ms": 0.7
        }))
    }

    #[test]
    fn manifest_is_strict_with_the_agreed_schema() {
        let manifest = fixture().manifest();
        assert_eq!(manifest.name, "get_current_weather");
        assert!(manifest.strict);
        assert_eq!(manifest.effects, Effects::ReadOnly);
        assert_eq!(manifest.max_attempts, 3);
        assert_eq!(manifest.timeout_ms, 5_000);
        assert!(manifest.description.contains("forecasts"));
        assert_eq!(
            manifest.parameters,
            json!({"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location","unit"],"additionalProperties":false})
        );
    }

    #[test]
    fn options_read_from_config_and_reject_bad_values() {
        let options: WeatherOptions =
            serde_json::from_value(json!({"backend": "open-meteo", "timeout": "1500ms"})).unwrap();
        assert_eq!(options.backend, WeatherBackend::OpenMeteo);
        assert_eq!(options.timeout, Duration::from_millis(1500));
        assert_eq!(options.forecast_url, "https://api.open-meteo.com");
        let tool = GetCurrentWeather::new(&options).unwrap();
        assert_eq!(tool.manifest().timeout_ms, 5_000);

        let slow = WeatherOptions {
            timeout: Duration::from_secs(10),
            ..WeatherOptions::default()
        };
        assert_eq!(
            GetCurrentWeather::new(&slow).unwrap().manifest().timeout_ms,
            12_000,
            "the attempt outlives the lookup"
        );

        assert!(serde_json::from_value::<WeatherOptions>(json!({"bakend": "fixture"})).is_err());
        assert!(serde_json::from_value::<WeatherOptions>(json!({"backend": "met"})).is_err());
        let err = GetCurrentWeather::new(&WeatherOptions {
            backend: WeatherBackend::OpenMeteo,
            geocoding_url: "ftp://example.com".into(),
            ..WeatherOptions::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("weather.geocoding_url"), "{err}");
    }

    #[tokio::test]
    async fn fixture_knows_four_cities_in_both_units() {
        let tool = fixture();
        let cases = [
            ("Boston, MA", "Boston, MA", 8.0, 46.4, "partly cloudy"),
            (
                "  san francisco, CA ",
                "San Francisco, CA",
                16.5,
                61.7,
                "fog",
            ),
            ("LONDON, UK", "London, UK", 11.0, 51.8, "light rain"),
            ("Beijing, China", "Beijing, China", 24.0, 75.2, "clear"),
        ];
        for (asked, resolved, celsius, fahrenheit, conditions) in cases {
            let data = ask(&tool, asked, "celsius").await.unwrap();
            assert_eq!(
                data,
                json!({"location": resolved, "temperature": celsius, "unit": "celsius",
                       "conditions": conditions, "source": "fixture"}),
                "{asked}"
            );
            let data = ask(&tool, asked, "fahrenheit").await.unwrap();
            assert_eq!(data["temperature"], json!(fahrenheit), "{asked}");
            assert_eq!(data["unit"], "fahrenheit");
        }
        assert_eq!(
            ask(&tool, "boston", "celsius").await.unwrap()["location"],
            "Boston, MA"
        );
    }

    #[tokio::test]
    async fn fixture_rejects_short_and_unknown_places() {
        let tool = fixture();
        for short in ["B", "  x ", ""] {
            match ask(&tool, short, "celsius").await {
                Err(err @ ToolError::InvalidArguments(_)) => {
                    assert_eq!(
                        err.to_string(),
                        "invalid arguments: location must be at least 2 characters"
                    );
                    assert!(!err.is_retryable());
                }
                other => panic!("{short:?}: expected invalid arguments, got {other:?}"),
            }
        }

        let (code, message, retryable) = coded(ask(&tool, " Atlantis ", "celsius").await);
        assert_eq!(code, LOCATION_NOT_FOUND);
        assert_eq!(
            message,
            r#"no place named "Atlantis" was found; try a city name such as "Boston, MA""#
        );
        assert!(!retryable);
        // Only the city part is matched, so a known qualifier cannot rescue it.
        assert_eq!(
            coded(ask(&tool, ", Boston", "celsius").await).0,
            LOCATION_NOT_FOUND
        );
    }

    #[tokio::test]
    async fn open_meteo_geocodes_then_reads_the_current_weather() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/v1/search"))
            .and(query_param("name", "Boston"))
            .and(query_param("count", "1"))
            .and(query_param("language", "en"))
            .and(query_param("format", "json"))
            .respond_with(boston_geocoding())
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/forecast"))
            .and(query_param("latitude", "42.35843"))
            .and(query_param("longitude", "-71.05977"))
            .and(query_param("current", "temperature_2m,weather_code"))
            .and(query_param("temperature_unit", "fahrenheit"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "latitude": 42.36, "longitude": -71.06,
                "current_units": {"temperature_2m": "°F", "weather_code": "wmo code"},
                "current": {"time": "2025-05-01T12:00", "interval": 900,
                            "temperature_2m": 70.3, "weather_code": 3}
            })))
            .expect(1)
            .mount(&server)
            .await;

        let tool = open_meteo(&server.uri(), Duration::from_secs(3));
        let data = ask(&tool, "Boston, MA", "fahrenheit").await.unwrap();
        assert_eq!(
            data,
            json!({"location": "Boston, Massachusetts, United States", "temperature": 70.3,
                   "unit": "fahrenheit", "conditions": "overcast", "source": "open-meteo"})
        );
    }

    #[tokio::test]
    async fn open_meteo_unknown_place_is_terminal() {
        let server = MockServer::start().await;
        Mock::given(path("/v1/search"))
            .and(query_param("name", "Atlantis"))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"generationtime_ms": 0.4})),
            )
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(path("/v1/search"))
            .and(query_param("name", "Nowhere"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"results": []})))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(path("/v1/forecast"))
            .respond_with(ResponseTemplate::new(500))
            .expect(0)
            .mount(&server)
            .await;

        let tool = open_meteo(&server.uri(), Duration::from_secs(3));
        for place in ["Atlantis", "Nowhere, XX"] {
            let (code, message, retryable) = coded(ask(&tool, place, "celsius").await);
            assert_eq!(code, LOCATION_NOT_FOUND);
            assert!(message.contains(&format!(r#""{place}""#)), "{message}");
            assert!(!retryable);
        }
    }

    #[tokio::test]
    async fn open_meteo_slow_service_times_out_retryably() {
        let server = MockServer::start().await;
        Mock::given(path("/v1/search"))
            .respond_with(boston_geocoding().set_delay(Duration::from_secs(5)))
            .mount(&server)
            .await;

        let tool = open_meteo(&server.uri(), Duration::from_millis(200));
        let started = Instant::now();
        let (code, message, retryable) = coded(ask(&tool, "Boston", "celsius").await);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(code, WEATHER_SERVICE_TIMEOUT);
        assert_eq!(
            message,
            "Weather service did not respond within 200 milliseconds"
        );
        assert!(retryable);
    }

    #[tokio::test]
    async fn open_meteo_outages_are_retryable_and_say_nothing_internal() {
        let server = MockServer::start().await;
        Mock::given(path("/v1/search"))
            .respond_with(boston_geocoding())
            .mount(&server)
            .await;
        Mock::given(path("/v1/forecast"))
            .respond_with(
                ResponseTemplate::new(503).set_body_string("upstream db at 10.0.0.7 down"),
            )
            .expect(1)
            .mount(&server)
            .await;
        let tool = open_meteo(&server.uri(), Duration::from_secs(3));
        let (code, message, retryable) = coded(ask(&tool, "Boston", "celsius").await);
        assert_eq!(code, WEATHER_SERVICE_UNAVAILABLE);
        assert!(retryable);
        assert!(
            !message.contains("10.0.0.7") && !message.contains("503"),
            "{message}"
        );

        // Nothing listens on a port we bound and released.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let closed = open_meteo(&format!("http://127.0.0.1:{port}"), Duration::from_secs(3));
        let (code, message, retryable) = coded(ask(&closed, "Boston", "celsius").await);
        assert_eq!(code, WEATHER_SERVICE_UNAVAILABLE);
        assert!(retryable);
        assert!(!message.contains("127.0.0.1"), "{message}");
    }

    #[tokio::test]
    async fn open_meteo_rate_limit_carries_retry_after() {
        let server = MockServer::start().await;
        Mock::given(path("/v1/search"))
            .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "2"))
            .expect(1)
            .mount(&server)
            .await;
        let tool = open_meteo(&server.uri(), Duration::from_secs(3));
        match ask(&tool, "Boston", "celsius").await {
            Err(err @ ToolError::RateLimited { retry_after }) => {
                assert_eq!(retry_after, Some(Duration::from_secs(2)));
                assert!(err.is_retryable());
            }
            other => panic!("expected rate limited, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn open_meteo_unexpected_answers_are_internal() {
        let server = MockServer::start().await;
        Mock::given(path("/v1/search"))
            .and(query_param("name", "Boston"))
            .respond_with(ResponseTemplate::new(200).set_body_string("<html>maintenance</html>"))
            .mount(&server)
            .await;
        Mock::given(path("/v1/search"))
            .and(query_param("name", "London"))
            .respond_with(ResponseTemplate::new(400).set_body_json(json!({"error": true})))
            .mount(&server)
            .await;
        let tool = open_meteo(&server.uri(), Duration::from_secs(3));
        for place in ["Boston", "London"] {
            match ask(&tool, place, "celsius").await {
                Err(err @ ToolError::Internal(_)) => assert!(!err.is_retryable()),
                other => panic!("{place}: expected an internal error, got {other:?}"),
            }
        }
    }

    #[test]
    fn helpers_speak_plainly() {
        assert_eq!(spoken_duration(Duration::from_secs(3)), "3 seconds");
        assert_eq!(spoken_duration(Duration::from_secs(1)), "1 second");
        assert_eq!(
            spoken_duration(Duration::from_millis(1500)),
            "1500 milliseconds"
        );
        assert_eq!(wmo_conditions(0), "clear");
        assert_eq!(wmo_conditions(81), "rain showers");
        assert_eq!(wmo_conditions(42), "unknown");
        let base = Url::parse("http://localhost:1/prefix/").unwrap();
        assert_eq!(
            endpoint_url(&base, &["v1", "search"], &[("name", "São Paulo & co")]).as_str(),
            "http://localhost:1/prefix/v1/search?name=S%C3%A3o+Paulo+%26+co"
        );
    }
}
