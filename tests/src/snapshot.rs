//! What a fleet left in Redis and on NATS, written down and loaded again:
//! the golden records and messages of the release before
//! (`tests/fixtures/previous-release/`), which this release must read.
//!
//! Redis (`redis.json`): `{"keys": [{"key", "type", "pttl", "value"}]}`,
//! the value by type: a string; a hash as an object; a list, and a set
//! (sorted), as arrays; a sorted set as `[member, score]` pairs in rank
//! order; a stream as its entries, `{"id", "fields": [[field, value]]}`.
//! NATS (`nats.json`): `{"messages": [{"stream", "subject", "headers",
//! "payload"}]}`, each stream's messages in order, headers as
//! `{name: [values]}`, the payload as UTF-8.

use std::path::Path;

use anyhow::{Context, bail};
use async_nats::jetstream;
use serde_json::Value;

/// Reads the JSON file `name` of the fixtures' directory `dir`, with every
/// time in it moved from `taken_ms`, when the fixtures were taken, to
/// `now_ms` (see [`moved_in_time`]).
///
/// # Errors
///
/// The file is missing or is not JSON.
pub fn read(dir: &Path, name: &str, (taken_ms, now_ms): (u64, u64)) -> anyhow::Result<Value> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&moved_in_time(&text, taken_ms, now_ms))
        .with_context(|| path.display().to_string())
}

/// `text` with every time in it (a number of milliseconds since the epoch
/// within two days of `taken_ms`, alone or in a stream id, also inside
/// JSON held in a string) moved by `now_ms - taken_ms`: deadlines, expiry
/// times, scores and stream ids stay as far from now as they were from
/// when the fixtures were taken, and in the same order.
pub fn moved_in_time(text: &str, taken_ms: u64, now_ms: u64) -> String {
    const TWO_DAYS_MS: u64 = 2 * 86_400_000;
    let window = taken_ms.saturating_sub(TWO_DAYS_MS)..=taken_ms + TWO_DAYS_MS;
    let mut moved = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphanumeric()) {
        moved.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        let (word, after) = rest.split_at(end);
        match word.parse::<u64>() {
            Ok(ms) if window.contains(&ms) => {
                moved.push_str(&(ms + now_ms).saturating_sub(taken_ms).to_string());
            }
            _ => moved.push_str(word),
        }
        rest = after;
    }
    moved.push_str(rest);
    moved
}

/// Writes every key of `dump` (`redis.json`) into `redis`, with its time
/// to live.
///
/// # Errors
///
/// A key of an unknown type or shape, or Redis refused a write.
pub async fn restore_redis(
    redis: &mut (impl redis::aio::ConnectionLike + Send),
    dump: &Value,
) -> anyhow::Result<usize> {
    let keys = dump["keys"].as_array().context("redis.json: no keys")?;
    for entry in keys {
        let key = text(&entry["key"])?;
        if entry["type"] == "stream" {
            restore_stream(redis, key, &entry["value"]).await?;
        } else {
            let () = write(key, entry)?
                .query_async(redis)
                .await
                .with_context(|| key.to_owned())?;
        }
        if let Some(ttl) = entry["pttl"].as_i64().filter(|ttl| *ttl > 0) {
            let () = redis::cmd("PEXPIRE")
                .arg(key)
                .arg(ttl)
                .query_async(redis)
                .await?;
        }
    }
    Ok(keys.len())
}

/// The command that writes the value of `entry` (of any type but a
/// stream) to `key`.
fn write(key: &str, entry: &Value) -> anyhow::Result<redis::Cmd> {
    let mut write = redis::cmd(match text(&entry["type"])? {
        "string" => "SET",
        "hash" => "HSET",
        "list" => "RPUSH",
        "set" => "SADD",
        "zset" => "ZADD",
        other => bail!("{key}: a key of type {other}"),
    });
    write.arg(key);
    match &entry["value"] {
        Value::String(string) => {
            write.arg(string);
        }
        Value::Object(fields) => {
            for (field, value) in fields {
                write.arg(field).arg(text(value)?);
            }
        }
        Value::Array(items) => {
            for item in items {
                match item {
                    // A sorted set's [member, score], written score first.
                    Value::Array(pair) => write.arg(text(&pair[1])?).arg(text(&pair[0])?),
                    member => write.arg(text(member)?),
                };
            }
        }
        other => bail!("{key}: a value {other}"),
    }
    Ok(write)
}

/// Adds the entries of the stream `key` with their ids.
async fn restore_stream(
    redis: &mut (impl redis::aio::ConnectionLike + Send),
    key: &str,
    entries: &Value,
) -> anyhow::Result<()> {
    for entry in entries.as_array().context("a stream's entries")? {
        let mut add = redis::cmd("XADD");
        add.arg(key).arg(text(&entry["id"])?);
        for pair in entry["fields"].as_array().context("an entry's fields")? {
            add.arg(text(&pair[0])?).arg(text(&pair[1])?);
        }
        let _: String = add
            .query_async(redis)
            .await
            .with_context(|| key.to_owned())?;
    }
    Ok(())
}

/// Publishes every message of `dump` (`nats.json`) whose stream `keep`
/// accepts, with its headers, on its subject, and waits for JetStream to
/// store each.
///
/// # Errors
///
/// A message of another shape, or JetStream refused one.
pub async fn restore_nats(
    js: &jetstream::Context,
    dump: &Value,
    keep: impl Fn(&str) -> bool,
) -> anyhow::Result<usize> {
    let mut published = 0;
    for message in dump["messages"]
        .as_array()
        .context("nats.json: no messages")?
    {
        if !keep(text(&message["stream"])?) {
            continue;
        }
        let mut headers = async_nats::HeaderMap::new();
        for (name, values) in message["headers"].as_object().into_iter().flatten() {
            for value in values.as_array().context("a header's values")? {
                headers.append(name.as_str(), text(value)?);
            }
        }
        let subject = text(&message["subject"])?.to_owned();
        let payload = text(&message["payload"])?.to_owned();
        js.publish_with_headers(subject, headers, payload.into())
            .await?
            .await?;
        published += 1;
    }
    Ok(published)
}

/// `value` as a string: a string's text, a number's digits.
fn text(value: &Value) -> anyhow::Result<&str> {
    value
        .as_str()
        .with_context(|| format!("{value} is not text"))
}

#[cfg(test)]
mod tests {
    use super::moved_in_time;

    #[test]
    fn times_move_and_nothing_else_does() {
        let taken = 1_796_667_778_739;
        let text = r#"{"deadline_ms":1796754176719,"id":"1796667774377-0","spec":"{\"at\":1796667774670}","n":1796667778739123,"job":"a1796667774377","small":86400000}"#;
        let moved = moved_in_time(text, taken, taken + 1_000);
        assert_eq!(
            moved,
            r#"{"deadline_ms":1796754177719,"id":"1796667775377-0","spec":"{\"at\":1796667775670}","n":1796667778739123,"job":"a1796667774377","small":86400000}"#
        );
    }
}
