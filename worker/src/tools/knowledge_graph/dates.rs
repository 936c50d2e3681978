//! Civil dates of facts and query windows: `YYYY-MM-DD`, `YYYY/MM/DD`, or an
//! ISO 8601 date-time whose date part is taken (`2019-07-07T00:00:00Z`).

use std::fmt;

use time::format_description::well_known::{Iso8601, Rfc3339};
use time::{Month, OffsetDateTime, PrimitiveDateTime};

/// A calendar day. Ordered, so that windows compare with `<`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Day(time::Date);

/// What every date argument accepts, for error messages.
pub const ACCEPTED_FORMATS: &str = "YYYY-MM-DD (e.g. 2019-07-07), YYYY/MM/DD, or an ISO 8601 date-time such as 2019-07-07T00:00:00Z";

impl Day {
    /// Parses a date in any accepted format; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        // Bounded before any parsing: no input makes this slow.
        if text.len() < 10 || text.len() > 40 || !text.is_char_boundary(10) {
            return None;
        }
        let (date, rest) = text.split_at(10);
        let day = Self::parse_date(date)?;
        if rest.is_empty() {
            return Some(day);
        }
        // A date-time: the whole text must be a valid one, in the dashed form.
        if !rest.starts_with(['T', 't', ' ']) || date.contains('/') {
            return None;
        }
        let iso = text.replacen(' ', "T", 1);
        let valid = OffsetDateTime::parse(&iso, &Rfc3339).is_ok()
            || OffsetDateTime::parse(&iso, &Iso8601::DEFAULT).is_ok()
            || PrimitiveDateTime::parse(&iso, &Iso8601::DEFAULT).is_ok();
        valid.then_some(day)
    }

    /// `YYYY-MM-DD` or `YYYY/MM/DD`, exactly ten ASCII characters.
    fn parse_date(date: &str) -> Option<Self> {
        let bytes = date.as_bytes();
        let separator = bytes[4];
        if !matches!(separator, b'-' | b'/') || bytes[7] != separator {
            return None;
        }
        let number = |range: std::ops::Range<usize>| -> Option<u16> {
            let digits = &date[range];
            if !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()
        };
        let year = i32::from(number(0..4)?);
        let month = Month::try_from(u8::try_from(number(5..7)?).ok()?).ok()?;
        let day = u8::try_from(number(8..10)?).ok()?;
        time::Date::from_calendar_date(year, month, day)
            .ok()
            .map(Self)
    }

    /// The year, for per-year summaries.
    pub fn year(self) -> i32 {
        self.0.year()
    }

    /// A day from its parts; `None` when there is no such day.
    pub fn from_ymd(year: i32, month: u8, day: u8) -> Option<Self> {
        let month = Month::try_from(month).ok()?;
        time::Date::from_calendar_date(year, month, day)
            .ok()
            .map(Self)
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let date = self.0;
        write!(
            f,
            "{:04}-{:02}-{:02}",
            date.year(),
            u8::from(date.month()),
            date.day()
        )
    }
}

impl serde::Serialize for Day {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_three_formats_and_rejects_everything_else() {
        let day = Day::from_ymd(2019, 7, 7).unwrap();
        for text in [
            "2019-07-07",
            " 2019/07/07 ",
            "2019-07-07T00:00:00Z",
            "2019-07-07T23:59:59+02:00",
            "2019-07-07 12:00:00Z",
            "2019-07-07T12:00:00",
        ] {
            assert_eq!(Day::parse(text), Some(day), "{text}");
        }
        for text in [
            "",
            "2019",
            "2019-7-7",
            "2019-02-30",
            "2019-13-01",
            "2019-07/07",
            "2019/07/07T00:00:00Z",
            "2019-07-07T25:00:00Z",
            "2019-07-07garbage",
            "07/07/2019",
            "２０１９-07-07",
            "+019-07-07",
            "2019-07-07T00:00:00Z and much more text after it, far too long",
        ] {
            assert_eq!(Day::parse(text), None, "{text}");
        }
    }

    #[test]
    fn days_order_and_print_as_iso_dates() {
        let early = Day::parse("2016-01-01").unwrap();
        let late = Day::parse("2020-12-31").unwrap();
        assert!(early < late);
        assert_eq!(late.to_string(), "2020-12-31");
        assert_eq!(late.year(), 2020);
        assert_eq!(serde_json::to_value(early).unwrap(), "2016-01-01");
    }
}
