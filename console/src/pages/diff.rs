//! A line diff of two texts, for an approver to see what an edit of a
//! call's arguments changes before it is sent. Hand-written: a longest
//! common subsequence over a few hundred lines of pretty JSON, bounded,
//! not worth a crate.

/// Most lines of either side diffed; longer texts are shown whole instead.
const MAX_LINES: usize = 500;

/// One line of a diff.
#[derive(Debug, PartialEq)]
pub(crate) struct Line {
    /// `same`, `removed` or `added`.
    pub kind: &'static str,
    pub text: String,
}

/// The lines of `before` and `after`, each marked kept, removed or added;
/// `None` when either is too long to diff.
pub(crate) fn lines(before: &str, after: &str) -> Option<Vec<Line>> {
    let (a, b): (Vec<&str>, Vec<&str>) = (before.lines().collect(), after.lines().collect());
    if a.len() > MAX_LINES || b.len() > MAX_LINES {
        return None;
    }
    // common[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut common = vec![vec![0u16; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let line = |kind, text: &str| Line {
        kind,
        text: text.to_owned(),
    };
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push(line("same", a[i]));
            (i, j) = (i + 1, j + 1);
        // On a tie the old line goes first: a change reads as removed,
        // then added.
        } else if j < b.len() && (i == a.len() || common[i][j + 1] > common[i + 1][j]) {
            out.push(line("added", b[j]));
            j += 1;
        } else {
            out.push(line("removed", a[i]));
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_line_reads_as_removed_then_added() {
        let kinds = |before, after| -> Vec<(&'static str, String)> {
            lines(before, after)
                .unwrap()
                .into_iter()
                .map(|l| (l.kind, l.text))
                .collect()
        };
        assert_eq!(
            kinds(
                "{\n  \"a\": 1,\n  \"b\": 2\n}",
                "{\n  \"a\": 1,\n  \"b\": 3\n}"
            ),
            [
                ("same", "{".to_owned()),
                ("same", "  \"a\": 1,".to_owned()),
                ("removed", "  \"b\": 2".to_owned()),
                ("added", "  \"b\": 3".to_owned()),
                ("same", "}".to_owned()),
            ]
        );
        assert_eq!(kinds("x", "x"), [("same", "x".to_owned())]);
        assert_eq!(kinds("", "y"), [("added", "y".to_owned())]);
        assert!(lines(&"l\n".repeat(600), "x").is_none(), "too long to diff");
    }
}
