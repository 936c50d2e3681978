//! The provider's key, cut out of everything its answer says. Servers have
//! echoed the key they were sent ("Incorrect API key provided: sk-…"), in
//! an error body, an in-band error of a 200, a stream's error event, or
//! (a model asked to) in the answer's own text. What a provider says is
//! stored in the job, sent to clients, logged and put on spans: each of
//! those reads it after the mask.
//!
//! The mask is the key the request was sent with (a rotated key masks its
//! own answers). It works on decoded text, so a key the server wrote with
//! JSON escapes (`sk-\u0061…`) is found in the parsed answer as well.

use std::sync::Arc;

use serde_json::Value;

use super::ModelError;

/// What replaces the key.
const MASKED: &str = "***";

/// The key one request was sent with; no key masks nothing.
#[derive(Clone, Default)]
pub(crate) struct Mask {
    key: Option<Arc<str>>,
}

// By hand: the key is never printed.
impl std::fmt::Debug for Mask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mask")
            .field("key", &self.key.as_ref().map(|_| MASKED))
            .finish()
    }
}

impl Mask {
    /// The mask of `key`; an empty key masks nothing.
    pub(crate) fn of(key: Option<Arc<str>>) -> Self {
        Self {
            key: key.filter(|key| !key.is_empty()),
        }
    }

    /// `text` with every occurrence of the key replaced.
    pub(crate) fn text(&self, text: String) -> String {
        match &self.key {
            Some(key) if text.contains(&**key) => text.replace(&**key, MASKED),
            _ => text,
        }
    }

    /// Every string of `value`, object keys included, masked.
    pub(crate) fn value(&self, value: &mut Value) {
        let Some(key) = &self.key else { return };
        match value {
            Value::String(text) if text.contains(&**key) => {
                *text = text.replace(&**key, MASKED);
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.value(item)),
            Value::Object(fields) => {
                if fields.keys().any(|name| name.contains(&**key)) {
                    *fields = std::mem::take(fields)
                        .into_iter()
                        .map(|(name, field)| (self.text(name), field))
                        .collect();
                }
                fields.values_mut().for_each(|field| self.value(field));
            }
            _ => {}
        }
    }

    /// `err` with its provider's text masked.
    pub(crate) fn error(&self, err: ModelError) -> ModelError {
        match err {
            ModelError::Rejected {
                status,
                code,
                message,
            } => ModelError::Rejected {
                status,
                code: code.map(|code| self.text(code)),
                message: self.text(message),
            },
            ModelError::Unavailable(reason) => ModelError::Unavailable(self.text(reason)),
            ModelError::InvalidResponse(reason) => ModelError::InvalidResponse(self.text(reason)),
            ModelError::Script(reason) => ModelError::Script(self.text(reason)),
            // Made of the configuration, before any answer.
            ModelError::Unbuilt(err) => ModelError::Unbuilt(err),
        }
    }

    /// Streamed text, `held` (what an earlier piece held back) then
    /// `piece`, split into what may be sent now, masked, and what must wait
    /// for the next piece: its longest end that could begin the key. A key
    /// split across pieces is so masked once whole, and never sent in
    /// parts.
    pub(crate) fn stream(&self, held: &str, piece: &str) -> (String, String) {
        let text = self.text(format!("{held}{piece}"));
        let Some(key) = &self.key else {
            return (text, String::new());
        };
        let wait = (1..key.len().min(text.len() + 1))
            .rev()
            .find(|&len| {
                let start = text.len() - len;
                text.is_char_boundary(start) && key.starts_with(&text[start..])
            })
            .unwrap_or(0);
        let (now, later) = text.split_at(text.len() - wait);
        (now.to_owned(), later.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const KEY: &str = "sk-live-7f3a";

    fn mask() -> Mask {
        Mask::of(Some(Arc::from(KEY)))
    }

    #[test]
    fn the_key_is_cut_out_of_text_values_and_errors() {
        assert_eq!(
            mask().text(format!("Incorrect API key provided: {KEY}.")),
            "Incorrect API key provided: ***."
        );
        let mut value = json!({
            "output": [{"text": format!("{KEY}{KEY}"), "n": 1}],
            KEY: [format!("a {KEY}"), null],
        });
        mask().value(&mut value);
        assert_eq!(
            value,
            json!({"output": [{"text": "******", "n": 1}], "***": ["a ***", null]})
        );
        let rejected = mask().error(ModelError::Rejected {
            status: 200,
            code: Some(KEY.into()),
            message: format!("bad key {KEY}"),
        });
        assert!(!rejected.to_string().contains(KEY), "{rejected}");
        assert!(matches!(rejected, ModelError::Rejected { code: Some(c), .. } if c == "***"));
        let unavailable = mask().error(ModelError::Unavailable(KEY.into()));
        assert_eq!(unavailable.to_string(), "the model API is unavailable: ***");
        assert_eq!(Mask::default().text(KEY.into()), KEY, "no key");
        assert_eq!(Mask::of(Some(Arc::from(""))).text("x".into()), "x");
    }

    #[test]
    fn a_key_split_across_pieces_is_held_back_then_masked_whole() {
        // (held, piece) -> (sent now, held back)
        let table = [
            ("", "hello", "hello", ""),
            ("", "my key is sk-", "my key is ", "sk-"),
            ("sk-", "live-", "", "sk-live-"),
            ("sk-live-", "7f3a!", "***!", ""),
            ("sk-", "lime", "sk-lime", ""),
            ("", "sk-sk-live-7", "sk-", "sk-live-7"),
            ("", "s", "", "s"),
            ("", "é sk-live-7f3a", "é ***", ""),
        ];
        for (held, piece, now, later) in table {
            assert_eq!(
                mask().stream(held, piece),
                (now.to_owned(), later.to_owned()),
                "{held:?} + {piece:?}"
            );
        }
        assert_eq!(
            Mask::default().stream("a", "b"),
            ("ab".to_owned(), String::new())
        );
    }
}
