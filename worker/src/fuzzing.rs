//! Entry points for the fuzz targets in `tests/fuzz`: the calculator's
//! parser, which is private to its tool. Built only with `--cfg fuzzing`
//! (cargo fuzz sets it); not an API.

/// An expression as a model would send it to `calculate`.
pub fn calculate(expression: &[u8]) {
    if let Ok(text) = std::str::from_utf8(expression) {
        let _ = crate::tools::calculate::evaluate(text);
    }
}
