//! The configuration section of an HTTP provider (`openai`, `anthropic`):
//! the keys every one of them has, in [`HttpOptions`], with one `Debug`
//! (the key masked) and one `Default` (its [`Api`]'s), and beside them, in
//! the same section, the keys a provider has of its own.
//!
//! A section is read key by key ([`Section`]), each value with its own
//! type, rather than with serde's `flatten`: `flatten` buffers the section
//! and reads it again, and an error then names the section, not the key
//! (`anthropic`, where the configuration's errors promise
//! `anthropic.max_retries`).

use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use toolfleet_service::config::duration;

use super::api_key::ApiKey;
use super::http::{self, BuildError};

/// An HTTP model API: the name of its configuration section, where the
/// defaults of its [`HttpOptions`] come from, and how its key is sent.
pub trait Api: Send + Sync + 'static {
    /// The configuration section (`openai`), named in errors.
    const SECTION: &'static str;
    /// The default base URL, `/v1` included.
    const BASE_URL: &'static str;
    /// The environment variable that, when set, is the default base URL
    /// instead.
    const BASE_URL_VAR: &'static str;
    /// The environment variable holding the default API key.
    const API_KEY_VAR: &'static str;
    /// The header that carries the key.
    const KEY_HEADER: &'static str;
    /// Whether the key is sent as `Bearer <key>` rather than alone.
    const BEARER: bool;
    /// The default timeout of one request.
    const REQUEST_TIMEOUT: Duration;
}

/// The keys every HTTP provider's section has: where its API is, its key,
/// and how its requests are bounded and retried (`openai.*`,
/// `anthropic.*`; `docs/configuration.md` lists each section's defaults).
#[derive(Clone, Serialize)]
#[serde(bound = "")]
pub struct HttpOptions<A: Api> {
    /// Base URL including `/v1`. Default: the API's variable
    /// (`OPENAI_BASE_URL`), else its public address.
    pub base_url: String,
    /// API key. Default: the API's variable (`OPENAI_API_KEY`). Never
    /// logged nor printed.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// A file holding the API key (a mounted Secret), read at start and
    /// again whenever it changes; exclusive with `api_key`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<PathBuf>,
    /// Timeout of one HTTP request. Default: the API's (120s for OpenAI,
    /// 600s for Anthropic).
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// Retries of a transient failure (408/409/429/5xx and connection
    /// errors). Default: 4.
    pub max_retries: u32,
    /// First retry delay; doubles each time, with jitter. Default: 500ms.
    #[serde(with = "duration")]
    pub initial_backoff: Duration,
    /// Longest delay between retries, a server's `Retry-After` included.
    /// Default: 30s.
    #[serde(with = "duration")]
    pub max_backoff: Duration,
    /// Largest response body read, a stream's events together; a longer
    /// one is an invalid response. Default: 8388608 (8 MiB).
    pub max_response_bytes: usize,
    /// Longest silence of a streamed answer before the attempt is given
    /// up and retried. Default: 90s.
    #[serde(with = "duration")]
    pub stream_idle_timeout: Duration,
    #[serde(skip)]
    api: PhantomData<fn() -> A>,
}

/// By hand, so that the API key never reaches a log line.
impl<A: Api> fmt::Debug for HttpOptions<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpOptions")
            .field("section", &A::SECTION)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("api_key_file", &self.api_key_file)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .finish()
    }
}

impl<A: Api> Default for HttpOptions<A> {
    fn default() -> Self {
        Self {
            base_url: std::env::var(A::BASE_URL_VAR).unwrap_or_else(|_| A::BASE_URL.into()),
            api_key: std::env::var(A::API_KEY_VAR)
                .ok()
                .filter(|key| !key.is_empty()),
            api_key_file: None,
            request_timeout: A::REQUEST_TIMEOUT,
            max_retries: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            max_response_bytes: 8 * 1024 * 1024,
            stream_idle_timeout: Duration::from_secs(90),
            api: PhantomData,
        }
    }
}

impl<A: Api> HttpOptions<A> {
    /// Whether a key is configured (in the options or a file).
    pub fn has_api_key(&self) -> bool {
        self.api_key.is_some() || self.api_key_file.is_some()
    }

    /// The checks of these keys at start: one key, and its file readable.
    ///
    /// # Errors
    ///
    /// What is wrong, naming the key.
    pub fn check(&self) -> Result<(), String> {
        self.api_key().map(drop).map_err(|err| err.to_string())
    }

    /// The key, sent in the API's header.
    ///
    /// # Errors
    ///
    /// [`BuildError::ApiKey`]: both the key and its file are set, or the
    /// file cannot be read.
    pub(crate) fn api_key(&self) -> Result<Option<ApiKey>, BuildError> {
        ApiKey::new(
            A::SECTION,
            A::KEY_HEADER,
            A::BEARER,
            self.api_key.as_deref(),
            self.api_key_file.as_deref(),
        )
        .map_err(BuildError::ApiKey)
    }

    /// How requests are bounded and retried.
    pub(crate) fn policy(&self) -> http::Policy {
        http::Policy {
            section: A::SECTION,
            request_timeout: self.request_timeout,
            max_retries: self.max_retries,
            initial_backoff: self.initial_backoff,
            max_backoff: self.max_backoff,
            max_response_bytes: self.max_response_bytes,
            stream_idle_timeout: self.stream_idle_timeout,
        }
    }

    /// The wire of a provider: its key, and `headers` on every request.
    ///
    /// # Errors
    ///
    /// The key cannot be read, a header is not a header value, or the HTTP
    /// client cannot be built.
    pub(crate) fn wire(
        &self,
        headers: &[(&'static str, String)],
    ) -> Result<http::Wire, BuildError> {
        http::Wire::new(self.policy(), headers, self.api_key()?)
    }
}

#[cfg(test)]
impl<A: Api> HttpOptions<A> {
    /// Fast-retrying options for a provider talking to `base_url` with
    /// `key`.
    pub(crate) fn for_tests(base_url: String, key: &str) -> Self {
        Self {
            base_url,
            api_key: Some(key.to_owned()),
            api_key_file: None,
            request_timeout: Duration::from_secs(5),
            max_retries: 2,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(200),
            max_response_bytes: 64 * 1024,
            stream_idle_timeout: Duration::from_millis(500),
            api: PhantomData,
        }
    }
}

impl<A: Api> Section for HttpOptions<A> {
    fn keys() -> &'static [&'static str] {
        &[
            "base_url",
            "api_key",
            "api_key_file",
            "request_timeout",
            "max_retries",
            "initial_backoff",
            "max_backoff",
            "max_response_bytes",
            "stream_idle_timeout",
        ]
    }

    fn read<'de, M: MapAccess<'de>>(&mut self, key: &str, map: &mut M) -> Result<bool, M::Error> {
        let duration = |map: &mut M| map.next_value::<duration::Value>().map(|value| value.0);
        match key {
            "base_url" => self.base_url = map.next_value()?,
            "api_key" => self.api_key = map.next_value()?,
            "api_key_file" => self.api_key_file = map.next_value()?,
            "request_timeout" => self.request_timeout = duration(map)?,
            "max_retries" => self.max_retries = map.next_value()?,
            "initial_backoff" => self.initial_backoff = duration(map)?,
            "max_backoff" => self.max_backoff = duration(map)?,
            "max_response_bytes" => self.max_response_bytes = map.next_value()?,
            "stream_idle_timeout" => self.stream_idle_timeout = duration(map)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl<'de, A: Api> Deserialize<'de> for HttpOptions<A> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        read_section(deserializer)
    }
}

/// A configuration section read key by key: its defaults, then each key
/// given, read with its own type (so that an error names the key). A
/// section that holds another's keys reads them through it.
pub(crate) trait Section: Default {
    /// Every key of the section.
    fn keys() -> &'static [&'static str];

    /// Reads the value of `key` from `map`; `false`, the value unread, when
    /// `key` is not one of this section's.
    ///
    /// # Errors
    ///
    /// The value's, which names the key.
    fn read<'de, M: MapAccess<'de>>(&mut self, key: &str, map: &mut M) -> Result<bool, M::Error>;
}

/// The section `S` as `deserializer` holds it: its defaults, and the keys
/// given. A key that is not the section's is an error, as serde's
/// `deny_unknown_fields` makes it.
///
/// # Errors
///
/// An unknown key, or a value of the wrong type; the error names the key.
pub(crate) fn read_section<'de, D: Deserializer<'de>, S: Section>(
    deserializer: D,
) -> Result<S, D::Error> {
    deserializer.deserialize_map(SectionVisitor(PhantomData))
}

struct SectionVisitor<S>(PhantomData<S>);

impl<'de, S: Section> Visitor<'de> for SectionVisitor<S> {
    type Value = S;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table of keys")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<S, M::Error> {
        let mut section = S::default();
        while let Some(key) = map.next_key_seed(KeyOf(S::keys()))? {
            if !section.read(&key, &mut map)? {
                // `keys` lists a key `read` does not know: a bug, said as
                // the unknown key it is to the reader.
                debug_assert!(false, "{key} is in keys() but not read");
                return Err(de::Error::unknown_field(&key, S::keys()));
            }
        }
        Ok(section)
    }
}

/// A key of a section, refused (while the key is read, so that the
/// error names it) unless it is one of `.0`.
struct KeyOf(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeyOf {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_identifier(self)
    }
}

impl Visitor<'_> for KeyOf {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<String, E> {
        if self.0.contains(&key) {
            Ok(key.to_owned())
        } else {
            Err(E::unknown_field(key, self.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use figment::Figment;
    use figment::providers::{Format, Serialized, Toml};
    use serde::de::DeserializeOwned;

    use super::*;
    use crate::model::{AnthropicOptions, OpenAiOptions};

    /// `section` as a layered load reads it: defaults, then `toml`.
    fn load<S: Serialize + DeserializeOwned + Default>(toml: &str) -> Result<S, String> {
        Figment::from(Serialized::defaults(S::default()))
            .merge(Toml::string(toml))
            .extract()
            .map_err(|err| err.to_string())
    }

    #[test]
    fn sections_keep_their_keys_defaults_and_errors() {
        // Every key printed reads back, and the two sections keep their
        // own defaults.
        let openai = OpenAiOptions::default();
        let anthropic = AnthropicOptions::default();
        assert_eq!(openai.request_timeout, Duration::from_secs(120));
        assert_eq!(anthropic.http.request_timeout, Duration::from_secs(600));
        let shown = serde_json::to_value(&anthropic).unwrap();
        let keys: Vec<&str> = shown
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for key in &keys {
            assert!(AnthropicOptions::keys().contains(key), "{key}");
        }
        assert!(!keys.contains(&"api_key"), "the key is never printed");

        let read: AnthropicOptions = load(
            "api_key = 'sk-1'\nmax_retries = 7\nmax_backoff = '2s'\nversion = '2099-01-01'\n\
             max_tokens = 9\nprompt_cache = '1h'",
        )
        .unwrap();
        assert_eq!(read.http.api_key.as_deref(), Some("sk-1"));
        assert_eq!(read.http.max_retries, 7);
        assert_eq!(read.http.max_backoff, Duration::from_secs(2));
        assert_eq!(read.http.request_timeout, Duration::from_secs(600));
        assert_eq!((read.version.as_str(), read.max_tokens), ("2099-01-01", 9));
        assert!(!format!("{read:?}").contains("sk-1"), "{read:?}");

        // Errors name the key, as a derived section's do.
        for (toml, named) in [
            ("max_retries = 'x'", "max_retries"),
            ("stream_idle_timeout = 'soon'", "stream_idle_timeout"),
            ("max_tokens = -1", "max_tokens"),
            ("bogus = 1", "bogus"),
        ] {
            let err = load::<AnthropicOptions>(toml).unwrap_err();
            assert!(err.contains(&format!("default.{named}")), "{toml}: {err}");
        }
        let err = load::<OpenAiOptions>("version = '2023-06-01'").unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
    }
}
