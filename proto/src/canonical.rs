//! Canonical JSON: one text for every way of writing the same JSON value,
//! so that what is hashed from it (a tool's contract hash,
//! [`ToolManifest::contract_hash`](crate::ToolManifest::contract_hash)) does
//! not change with key order, whitespace or how a number was spelled.
//!
//! The form, close to RFC 8785 (JCS) and written by this module alone
//! (never left to `serde_json`'s map order, which a feature elsewhere in a
//! build may change):
//! - no whitespace outside strings;
//! - object keys sorted by their UTF-16 code units, as JCS sorts them
//!   (the same order as by bytes for keys within the Basic Multilingual
//!   Plane), recursively;
//! - strings as `serde_json` escapes them: `"` and `\` escaped, control
//!   characters as `\n`, `\t`, ... or `\u00XX`, everything else as is (no
//!   Unicode normalization);
//! - a number that is an integer, however written (`1`, `1.0`, `1e0`), in
//!   decimal with no fraction (JSON Schema reads `1.0` as the integer 1);
//!   another number in the shortest form that reads back to the same
//!   `f64`, as `serde_json` writes it (`0.5`, `1e-7`, `1.5e+300`).

use std::fmt::Write as _;

use serde_json::{Number, Value};

/// The canonical text of `value` (see the [module](self) for the form).
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_string(out, text),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

/// The largest integer an `f64` holds exactly with every integer below it.
const EXACT_F64_INTEGERS: f64 = 9_007_199_254_740_992.0; // 2^53

fn write_number(out: &mut String, number: &Number) {
    if let Some(n) = number.as_i64() {
        let _ = write!(out, "{n}"); // writing to a String cannot fail
    } else if let Some(n) = number.as_u64() {
        let _ = write!(out, "{n}");
    } else if let Some(f) = number.as_f64() {
        if f.fract() == 0.0 && f.abs() < EXACT_F64_INTEGERS {
            // An integer written with a fraction or an exponent. The cast
            // is exact: |f| < 2^53 and f has no fraction.
            #[allow(clippy::cast_possible_truncation)]
            let n = f as i64;
            let _ = write!(out, "{n}");
        } else {
            // serde_json writes a finite f64 in its shortest round-trip
            // form (remade from the f64: not the text as it came in).
            let shortest = Number::from_f64(f).unwrap_or_else(|| number.clone());
            let _ = write!(out, "{shortest}");
        }
    }
}

fn write_string(out: &mut String, text: &str) {
    // Serializing a str cannot fail.
    out.push_str(&serde_json::to_string(text).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_text_for_every_spelling_of_a_value() {
        let cases = [
            // key order and whitespace
            (
                r#"{ "b": 1, "a": [ true, null ] }"#,
                r#"{"a":[true,null],"b":1}"#,
            ),
            // nested objects, arrays keep their order
            (
                r#"{"z":{"y":2,"x":[{"d":0,"c":1}]}}"#,
                r#"{"z":{"x":[{"c":1,"d":0}],"y":2}}"#,
            ),
            // integers however written
            ("[1, 1.0, 1e0, -0.0, 100e-2]", "[1,1,1,0,1]"),
            // other numbers in their shortest form
            ("[0.5, 1e-7, 1.5e300]", "[0.5,1e-7,1.5e+300]"),
            // big integers as they are
            (
                "[18446744073709551615, -9223372036854775808]",
                "[18446744073709551615,-9223372036854775808]",
            ),
            // strings escaped as serde_json escapes them
            (
                r#"["a\"b\\c\n", "é", "\u0001"]"#,
                r#"["a\"b\\c\n","é","\u0001"]"#,
            ),
        ];
        for (input, canonical) in cases {
            let value: Value = serde_json::from_str(input).expect(input);
            assert_eq!(to_string(&value), canonical, "{input}");
            // The canonical text is JSON of the same value, and a fixed point.
            let again: Value = serde_json::from_str(canonical).expect(canonical);
            assert_eq!(to_string(&again), canonical, "{input}");
        }
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // By UTF-8 bytes U+FF21 (EF BC A1) comes before U+1F600 (F0 9F 98
        // 80); by UTF-16 units U+1F600 (D83D DE00) comes first, as in JCS.
        let value = json!({"\u{FF21}": 1, "\u{1F600}": 2, "a": 3});
        assert_eq!(
            to_string(&value),
            "{\"a\":3,\"\u{1F600}\":2,\"\u{FF21}\":1}"
        );
    }
}
