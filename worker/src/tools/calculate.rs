//! `calculate`: evaluates an arithmetic expression with a hand-written parser.
//! Nothing is ever handed to an interpreter, so the only thing an expression
//! can do is arithmetic.
//!
//! Grammar, loosest binding first (whitespace is ignored between tokens):
//!
//! ```text
//! sum     = product (("+" | "-") product)*         left-associative
//! product = unary (("*" | "/" | "%") unary)*        left-associative
//! unary   = ("+" | "-") unary | power
//! power   = primary (("^" | "**") unary)?           right-associative
//! primary = number | "(" sum ")"
//! number  = digits ["." [digits]] [exponent] | "." digits [exponent]
//! exponent = ("e" | "E") ["+" | "-"] digits
//! ```
//!
//! The choices the grammar makes:
//! - Power binds tighter than unary minus, as in mathematics and Python:
//!   `-2^2` is `-4`, and `2^-1` is `0.5` because an exponent may carry a sign.
//! - Power is right-associative: `2^3^2` is `2^9 = 512`.
//! - `%` is the remainder with the sign of the dividend (as in C, Rust and
//!   JavaScript, unlike Python): `-7 % 3` is `-1`. It works on decimals too.
//! - Numbers are decimal, with optional scientific notation (`1e3`, `2.5E-4`).
//!   There are no functions, variables, constants or implicit multiplication
//!   (`2(3)`), and no hex or thousands separators.
//! - Arithmetic is IEEE 754 double precision, so `0.1 + 0.2` is
//!   `0.30000000000000004`. A result that is integral and within ±2^53 is
//!   returned as a JSON integer, anything else as a JSON float.
//!
//! Limits keep every call cheap and the stack shallow: at most 1000
//! characters, 256 tokens (numbers, operators and parentheses), and 64 levels
//! of parentheses, unary signs and exponents nested in one another.
//!
//! Syntax errors and broken limits are `INVALID_TOOL_ARGUMENTS`; division or
//! modulo by zero and results that are not finite are [`CALCULATION_ERROR`].
//! Both are terminal, and their messages give positions as character offsets
//! counted from 0.

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::{Effects, ErrorCode, ToolManifest};

use crate::tool::{Tool, ToolContext, ToolError};

/// The expression is well-formed but has no finite value: division or modulo
/// by zero, an overflow, or a negative number raised to a fractional power.
/// Terminal.
pub const CALCULATION_ERROR: ErrorCode = ErrorCode::from_static("CALCULATION_ERROR");

const MAX_CHARS: usize = 1000;
const MAX_TOKENS: usize = 256;
const MAX_DEPTH: usize = 64;

/// 2^53: every integer up to here is exact in an f64 and in a JSON reader's double.
const MAX_EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

const ALLOWED: &str = "only numbers, + - * / % ^ ** and parentheses are allowed";

const DESCRIPTION: &str = "Evaluate an arithmetic expression and return its numeric result. \
Use it for any arithmetic rather than computing in your head. \
Supports decimal numbers (42, 3.5, .5, 1e3, 2.5E-4), + - * /, % (remainder with the sign of the \
dividend: -7 % 3 = -1), ^ or ** for power (right-associative: 2^3^2 = 512; it binds tighter than \
unary minus: -2^2 = -4, (-2)^2 = 4), unary + and -, and parentheses. \
There are no functions, variables or constants, and no implicit multiplication: write \
2 * (3 + 4), not 2(3 + 4); write 2 ^ 0.5 for a square root. \
Uses double-precision floats; at most 1000 characters. \
Errors: INVALID_TOOL_ARGUMENTS for bad syntax (fix the expression), CALCULATION_ERROR for \
division by zero or a result too large to represent.";

/// Evaluates arithmetic expressions: numbers, `+ - * / % ^ **`, unary signs
/// and parentheses. See the module docs for the exact grammar.
#[derive(Debug, Clone, Copy, Default)]
pub struct Calculate;

impl Tool for Calculate {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "calculate",
            DESCRIPTION,
            json!({
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "description": "The arithmetic expression, e.g. \"(12.5 - 2) * 3^2 / 7\"."
                    }
                },
                "required": ["expression"],
                "additionalProperties": false
            }),
        )
        // Evaluation takes microseconds and gives the same answer every time,
        // so neither a long timeout nor a retry can help.
        .with_timeout(Duration::from_secs(2))
        .with_max_attempts(1)
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        let Some(expression) = args.get("expression").and_then(Value::as_str) else {
            return Err(ToolError::InvalidArguments(
                "\"expression\" must be a string".into(),
            ));
        };
        let result = evaluate(expression).map_err(CalcError::into_tool_error)?;
        Ok(json!({"expression": expression, "result": to_json_number(result)}))
    }
}

/// Why an expression has no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum CalcError {
    /// The expression is not valid syntax or breaks a limit; the model should
    /// rewrite it.
    #[error("{0}")]
    Invalid(String),
    /// The expression is valid but has no finite value; rewriting the syntax
    /// won't help.
    #[error("{0}")]
    Arithmetic(String),
}

impl CalcError {
    fn into_tool_error(self) -> ToolError {
        match self {
            Self::Invalid(message) => ToolError::InvalidArguments(message),
            Self::Arithmetic(message) => ToolError::terminal(CALCULATION_ERROR, message),
        }
    }
}

/// Integral results become JSON integers so the model reads `5`, not `5.0`.
fn to_json_number(value: f64) -> Value {
    if value.fract() == 0.0 && value.abs() <= MAX_EXACT_INTEGER {
        // Integral and within ±2^53, so the cast is exact (and turns -0 into 0).
        Value::from(value as i64)
    } else {
        // `evaluate` only returns finite values, which serde_json keeps as numbers.
        Value::from(value)
    }
}

/// Parses and evaluates `expression`, enforcing every limit.
pub(crate) fn evaluate(expression: &str) -> Result<f64, CalcError> {
    // Checked before anything else so that a huge input costs no more than this.
    if expression.chars().nth(MAX_CHARS).is_some() {
        return Err(CalcError::Invalid(format!(
            "expression is longer than {MAX_CHARS} characters; split the calculation into smaller steps"
        )));
    }
    let tokens = tokenize(expression)?;
    if tokens.is_empty() {
        return Err(CalcError::Invalid(
            "expression is empty; pass an arithmetic expression such as \"2 * (3 + 4)\"".into(),
        ));
    }
    if tokens.len() > MAX_TOKENS {
        return Err(CalcError::Invalid(format!(
            "expression has {} numbers, operators and parentheses; the limit is {MAX_TOKENS}, \
             so split the calculation into smaller steps",
            tokens.len()
        )));
    }
    parse(&tokens)?.eval()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum TokenKind {
    Number(f64),
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Caret,
    StarStar,
    LParen,
    RParen,
}

impl fmt::Display for TokenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::Number(_) => "a number",
            Self::Plus => "'+'",
            Self::Minus => "'-'",
            Self::Star => "'*'",
            Self::Slash => "'/'",
            Self::Percent => "'%'",
            Self::Caret => "'^'",
            Self::StarStar => "'**'",
            Self::LParen => "'('",
            Self::RParen => "')'",
        };
        f.write_str(text)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Token {
    kind: TokenKind,
    /// Character offset from 0, for error messages.
    at: usize,
}

fn tokenize(expression: &str) -> Result<Vec<Token>, CalcError> {
    // Indexing by character keeps the positions in messages what the model counts.
    let chars: Vec<char> = expression.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let at = i;
        let kind = match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '0'..='9' | '.' => {
                let (value, end) = scan_number(&chars, at)?;
                i = end;
                tokens.push(Token {
                    kind: TokenKind::Number(value),
                    at,
                });
                continue;
            }
            c if c.is_alphabetic() || c == '_' => {
                let end = chars[at..]
                    .iter()
                    .position(|&c| !(c.is_alphanumeric() || c == '_'))
                    .map_or(chars.len(), |n| at + n);
                let name: String = chars[at..end].iter().collect();
                return Err(CalcError::Invalid(format!(
                    "unknown name '{name}' at position {at}; {ALLOWED} \
                     (no functions, variables or constants)"
                )));
            }
            '+' => TokenKind::Plus,
            '-' => TokenKind::Minus,
            '*' if chars.get(i + 1) == Some(&'*') => {
                i += 1;
                TokenKind::StarStar
            }
            '*' => TokenKind::Star,
            '/' => TokenKind::Slash,
            '%' => TokenKind::Percent,
            '^' => TokenKind::Caret,
            '(' => TokenKind::LParen,
            ')' => TokenKind::RParen,
            other => {
                return Err(CalcError::Invalid(format!(
                    "unexpected character {other:?} at position {at}; {ALLOWED}{}",
                    hint(other)
                )));
            }
        };
        i += 1;
        tokens.push(Token { kind, at });
    }
    Ok(tokens)
}

/// Models often write typographic operators or thousands separators; name the fix.
fn hint(c: char) -> &'static str {
    match c {
        '×' | '·' | '⋅' => " (use '*' for multiplication)",
        '÷' | '∕' => " (use '/' for division)",
        '−' | '–' | '—' => " (use the ASCII '-' for minus)",
        ',' | '_' | '\'' => " (write numbers without thousands separators, with '.' for decimals)",
        _ => "",
    }
}

/// Scans the number starting at `start`; returns its value and the offset after it.
fn scan_number(chars: &[char], start: usize) -> Result<(f64, usize), CalcError> {
    let digits_from = |i: usize| {
        chars[i..]
            .iter()
            .position(|c| !c.is_ascii_digit())
            .map_or(chars.len(), |n| i + n)
    };
    let mut end = digits_from(start);
    let mut has_digits = end > start;
    if chars.get(end) == Some(&'.') {
        let fraction_end = digits_from(end + 1);
        has_digits |= fraction_end > end + 1;
        end = fraction_end;
    }
    if !has_digits {
        return Err(CalcError::Invalid(format!(
            "a '.' at position {start} is not a number; write decimals like 0.5 or .5"
        )));
    }
    if matches!(chars.get(end), Some('e' | 'E')) {
        let mut digits_start = end + 1;
        if matches!(chars.get(digits_start), Some('+' | '-')) {
            digits_start += 1;
        }
        let exponent_end = digits_from(digits_start);
        if exponent_end == digits_start {
            return Err(CalcError::Invalid(format!(
                "the number at position {start} has an exponent without digits; \
                 write scientific notation like 1e3 or 2.5E-4 (there is no constant e)"
            )));
        }
        end = exponent_end;
    }
    if chars.get(end) == Some(&'.') {
        return Err(CalcError::Invalid(format!(
            "malformed number at position {start}: more than one '.'"
        )));
    }
    let text: String = chars[start..end].iter().collect();
    // The scan above accepts a subset of what `f64::from_str` does, so this
    // fails only if that changes; report it rather than trust it.
    let value: f64 = text.parse().map_err(|_| {
        CalcError::Invalid(format!("malformed number '{text}' at position {start}"))
    })?;
    if !value.is_finite() {
        return Err(CalcError::Invalid(format!(
            "the number '{text}' at position {start} is too large; the limit is about 1.8e308"
        )));
    }
    Ok((value, end))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinaryOp {
    Add,
    Subtract,
    Multiply,
    Divide,
    Remainder,
    Power,
}

impl BinaryOp {
    fn name(self) -> &'static str {
        match self {
            Self::Add => "addition",
            Self::Subtract => "subtraction",
            Self::Multiply => "multiplication",
            Self::Divide => "division",
            Self::Remainder => "modulo",
            Self::Power => "power",
        }
    }

    fn apply(self, lhs: f64, rhs: f64, at: usize) -> Result<f64, CalcError> {
        let value = match self {
            Self::Add => lhs + rhs,
            Self::Subtract => lhs - rhs,
            Self::Multiply => lhs * rhs,
            Self::Divide | Self::Remainder if rhs == 0.0 => {
                return Err(CalcError::Arithmetic(format!(
                    "{} by zero: the right side of the '{}' at position {at} is 0",
                    self.name(),
                    if self == Self::Divide { '/' } else { '%' },
                )));
            }
            Self::Divide => lhs / rhs,
            Self::Remainder => lhs % rhs,
            Self::Power if lhs == 0.0 && rhs < 0.0 => {
                return Err(CalcError::Arithmetic(format!(
                    "0 raised to a negative power is a division by zero (the power at position {at})"
                )));
            }
            Self::Power if lhs < 0.0 && rhs.fract() != 0.0 => {
                return Err(CalcError::Arithmetic(format!(
                    "a negative number raised to a fractional power has no real value \
                     (the power at position {at})"
                )));
            }
            Self::Power => lhs.powf(rhs),
        };
        if value.is_nan() {
            // Finite operands with the cases above excluded never give NaN;
            // this stays as a net so no NaN reaches the model.
            return Err(CalcError::Arithmetic(format!(
                "the {} at position {at} has no real value",
                self.name()
            )));
        }
        if value.is_infinite() {
            return Err(CalcError::Arithmetic(format!(
                "the {} at position {at} overflows: its result is beyond about ±1.8e308",
                self.name()
            )));
        }
        Ok(value)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Number(f64),
    Negate(Box<Expr>),
    Binary {
        op: BinaryOp,
        at: usize,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
}

impl Expr {
    /// Recursion here is bounded by the tree's height, which is at most the
    /// number of tokens, which `evaluate` caps at `MAX_TOKENS`.
    fn eval(&self) -> Result<f64, CalcError> {
        match self {
            Self::Number(value) => Ok(*value),
            Self::Negate(inner) => Ok(-inner.eval()?),
            Self::Binary { op, at, lhs, rhs } => op.apply(lhs.eval()?, rhs.eval()?, *at),
        }
    }
}

/// Builds the whole tree before evaluating anything, so a syntax error is
/// reported even when an arithmetic error comes before it.
fn parse(tokens: &[Token]) -> Result<Expr, CalcError> {
    let mut parser = Parser {
        tokens,
        next: 0,
        depth: 0,
    };
    let expr = parser.sum()?;
    match parser.peek() {
        None => Ok(expr),
        Some(Token {
            kind: TokenKind::RParen,
            at,
        }) => Err(CalcError::Invalid(format!(
            "unbalanced parentheses: the ')' at position {at} has no matching '('"
        ))),
        Some(token) => Err(unexpected_after_operand(token, "the end of the expression")),
    }
}

fn unexpected_after_operand(token: Token, or: &str) -> CalcError {
    let implicit = if matches!(token.kind, TokenKind::Number(_) | TokenKind::LParen) {
        " (there is no implicit multiplication: write 2 * (3), not 2(3))"
    } else {
        ""
    };
    CalcError::Invalid(format!(
        "expected an operator or {or} at position {}, found {}{implicit}",
        token.at, token.kind
    ))
}

struct Parser<'t> {
    tokens: &'t [Token],
    next: usize,
    /// Parentheses, unary signs and exponents currently open; the only
    /// recursive paths, so bounding this bounds the stack.
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<Token> {
        self.tokens.get(self.next).copied()
    }

    fn descend(&mut self, at: usize) -> Result<(), CalcError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(CalcError::Invalid(format!(
                "expression nests deeper than {MAX_DEPTH} levels of parentheses, signs and \
                 powers (at position {at}); simplify it or split it into steps"
            )));
        }
        Ok(())
    }

    fn ascend(&mut self) {
        self.depth -= 1;
    }

    fn sum(&mut self) -> Result<Expr, CalcError> {
        let mut lhs = self.product()?;
        while let Some(token) = self.peek() {
            let op = match token.kind {
                TokenKind::Plus => BinaryOp::Add,
                TokenKind::Minus => BinaryOp::Subtract,
                _ => break,
            };
            self.next += 1;
            let rhs = self.product()?;
            lhs = Expr::Binary {
                op,
                at: token.at,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
            };
        }
        Ok(lhs)
    }

    fn product(&mut self) -> Result<Expr, CalcError> {
        let mut lhs = self.unary()?;
        while let Some(token) = self.peek() {
            let op = match token.kind {
                TokenKind::Star => BinaryOp::Multiply,
                TokenKind::Slash => BinaryOp::Divide,
                TokenKind::Percent => BinaryOp::Remainder,
                _ => break,
            };
            self.next += 1;
            let rhs = self.unary()?;
            lhs = Expr::Binary {
                op,
                at: token.at,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
            };
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, CalcError> {
        let Some(token) = self.peek() else {
            return self.power();
        };
        let negate = match token.kind {
            TokenKind::Minus => true,
            TokenKind::Plus => false,
            _ => return self.power(),
        };
        self.next += 1;
        self.descend(token.at)?;
        let inner = self.unary()?;
        self.ascend();
        Ok(if negate {
            Expr::Negate(Box::new(inner))
        } else {
            inner
        })
    }

    fn power(&mut self) -> Result<Expr, CalcError> {
        let base = self.primary()?;
        let Some(token) = self
            .peek()
            .filter(|t| matches!(t.kind, TokenKind::Caret | TokenKind::StarStar))
        else {
            return Ok(base);
        };
        self.next += 1;
        self.descend(token.at)?;
        // `unary`, not `primary`: that makes `^` right-associative and lets
        // the exponent carry a sign (`2^-1`).
        let exponent = self.unary()?;
        self.ascend();
        Ok(Expr::Binary {
            op: BinaryOp::Power,
            at: token.at,
            lhs: Box::new(base),
            rhs: Box::new(exponent),
        })
    }

    fn primary(&mut self) -> Result<Expr, CalcError> {
        let Some(token) = self.peek() else {
            let message = match self.tokens.last() {
                Some(last) => format!(
                    "expression ends after {} at position {}; expected a number or '('",
                    last.kind, last.at
                ),
                None => "expression is empty".into(),
            };
            return Err(CalcError::Invalid(message));
        };
        self.next += 1;
        match token.kind {
            TokenKind::Number(value) => Ok(Expr::Number(value)),
            TokenKind::LParen => {
                self.descend(token.at)?;
                let inner = self.sum()?;
                match self.peek() {
                    Some(Token {
                        kind: TokenKind::RParen,
                        ..
                    }) => self.next += 1,
                    None => {
                        return Err(CalcError::Invalid(format!(
                            "unbalanced parentheses: the '(' at position {} is never closed; add ')'",
                            token.at
                        )));
                    }
                    Some(other) => return Err(unexpected_after_operand(other, "')'")),
                }
                self.ascend();
                Ok(inner)
            }
            other => Err(CalcError::Invalid(format!(
                "expected a number or '(' at position {}, found {other}",
                token.at
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_message(expression: &str) -> String {
        match evaluate(expression) {
            Err(CalcError::Invalid(message)) => message,
            other => panic!("{expression:?}: expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn good_expressions_follow_precedence_and_associativity() {
        let cases: &[(&str, f64)] = &[
            ("1", 1.0),
            ("  \t( 1 )\n", 1.0),
            ("2 + 3 * 4", 14.0),
            ("(2 + 3) * 4", 20.0),
            ("2-3-4", -5.0),
            ("100 / 10 / 5", 2.0),
            ("2 * 3 % 4", 2.0),
            ("10 - 2 * 3 ^ 2", -8.0),
            ("2^3^2", 512.0),
            ("2**3**2", 512.0),
            ("(2^3)^2", 64.0),
            ("-2^2", -4.0),
            ("(-2)^2", 4.0),
            ("2^-1", 0.5),
            ("-2^-2", -0.25),
            ("4 ^ 0.5", 2.0),
            ("(-8) ^ 3", -512.0),
            ("-3 + +4", 1.0),
            ("--3", 3.0),
            ("1 - -1", 2.0),
            ("-(2 + 3)", -5.0),
            ("3.5 * 2", 7.0),
            (".5 + 5.", 5.5),
            ("1e3", 1000.0),
            ("2.5E-1", 0.25),
            ("1.5e+2", 150.0),
            ("7 % 3", 1.0),
            ("-7 % 3", -1.0),
            ("7 % -3", 1.0),
            ("7.5 % 2", 1.5),
            ("0.1 + 0.2", 0.1 + 0.2),
            ("((((((1 + 1))))))", 2.0),
            ("0 ^ 0", 1.0),
        ];
        for &(expression, expected) in cases {
            match evaluate(expression) {
                Ok(value) => assert_eq!(value, expected, "{expression:?}"),
                Err(err) => panic!("{expression:?}: {err}"),
            }
        }
    }

    #[test]
    fn bad_expressions_are_invalid_with_a_helpful_message() {
        let cases: &[(&str, &str)] = &[
            ("", "expression is empty"),
            ("   \n", "expression is empty"),
            (
                "__import__('os')",
                "unknown name '__import__' at position 0",
            ),
            ("2 + x", "unknown name 'x' at position 4"),
            ("sqrt(2)", "no functions"),
            ("pi * 2", "unknown name 'pi'"),
            ("2e", "exponent without digits"),
            (
                "2 $ 3",
                "unexpected character '$' at position 2; only numbers",
            ),
            ("3 × 4", "use '*'"),
            ("1,000", "thousands separators"),
            ("1 = 1", "unexpected character '='"),
            ("\u{0}", "'\\0'"),
            (
                "1 2",
                "expected an operator or the end of the expression at position 2",
            ),
            ("2(3)", "no implicit multiplication"),
            ("(1 2)", "expected an operator or ')' at position 3"),
            ("(1 + 2", "'(' at position 0 is never closed"),
            ("1 + 2)", "')' at position 5 has no matching '('"),
            (")", "expected a number or '(' at position 0, found ')'"),
            ("()", "found ')'"),
            ("2 +", "ends after '+' at position 2"),
            ("2 ^", "ends after '^'"),
            ("* 2", "expected a number or '(' at position 0, found '*'"),
            ("2 *** 3", "found '*'"),
            ("2 ^^ 3", "found '^'"),
            (".", "'.' at position 0 is not a number"),
            ("1..2", "more than one '.'"),
            ("1.2.3", "more than one '.'"),
            ("1e400", "too large"),
            // A syntax error wins over an arithmetic error that comes first.
            ("1/0 + )", "found ')'"),
        ];
        for &(expression, needle) in cases {
            let message = invalid_message(expression);
            assert!(message.contains(needle), "{expression:?}: {message:?}");
        }
    }

    #[test]
    fn arithmetic_failures_are_calculation_errors() {
        let cases: &[(&str, &str)] = &[
            (
                "1/0",
                "division by zero: the right side of the '/' at position 1",
            ),
            ("5 / (2 - 2)", "division by zero"),
            ("1 % 0", "modulo by zero"),
            ("1e308 * 10", "multiplication at position 6 overflows"),
            ("-1e308 - 1e308", "subtraction at position 7 overflows"),
            ("10 ^ 400", "power at position 3 overflows"),
            // powf is constant-time, so a huge exponent fails fast instead of looping.
            ("2 ^ 99999999999", "overflows"),
            ("2 ^ 2 ^ 2 ^ 2 ^ 2", "overflows"),
            ("0 ^ -1", "0 raised to a negative power"),
            ("(-8) ^ (1/3)", "fractional power"),
        ];
        for &(expression, needle) in cases {
            match evaluate(expression) {
                Err(CalcError::Arithmetic(message)) => {
                    assert!(message.contains(needle), "{expression:?}: {message:?}");
                }
                other => panic!("{expression:?}: expected Arithmetic, got {other:?}"),
            }
        }
    }

    #[test]
    fn limits_reject_big_inputs_without_exhausting_the_stack() {
        let padded = format!("1{}", " ".repeat(MAX_CHARS - 1));
        assert_eq!(evaluate(&padded), Ok(1.0));
        let too_long = format!("1{}", " ".repeat(MAX_CHARS));
        assert!(invalid_message(&too_long).contains("longer than 1000 characters"));

        // n ones joined by '+' are 2n - 1 tokens.
        let tokens = |n: usize| vec!["1"; n].join("+");
        assert_eq!(evaluate(&tokens(128)), Ok(128.0));
        assert!(invalid_message(&tokens(129)).contains("the limit is 256"));

        let parens = |n: usize| format!("{}1{}", "(".repeat(n), ")".repeat(n));
        let signs = |n: usize| format!("{}1", "-".repeat(n));
        let powers = |n: usize| format!("1{}", "^1".repeat(n));
        assert_eq!(evaluate(&parens(MAX_DEPTH)), Ok(1.0));
        assert_eq!(evaluate(&signs(MAX_DEPTH)), Ok(1.0));
        assert_eq!(evaluate(&powers(MAX_DEPTH)), Ok(1.0));
        for deep in [
            parens(MAX_DEPTH + 1),
            signs(MAX_DEPTH + 1),
            powers(MAX_DEPTH + 1),
        ] {
            assert!(invalid_message(&deep).contains("deeper than 64"), "{deep}");
        }

        // Through `evaluate` the length limit fires first; the parser alone must
        // still refuse rather than recurse ten thousand levels.
        let huge = parens(10_000);
        assert!(invalid_message(&huge).contains("longer than"));
        for huge in [huge, signs(10_000), powers(10_000)] {
            let tokens = tokenize(&huge).expect("only valid tokens");
            match parse(&tokens) {
                Err(CalcError::Invalid(message)) => assert!(message.contains("deeper than")),
                other => panic!("expected a depth error, got {other:?}"),
            }
        }
    }

    /// A deterministic stand-in for proptest, which this crate doesn't depend on.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // The high bits of an LCG are the random-looking ones.
            (self.0 >> 33) as usize % n
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len())]
        }

        fn well_formed(&mut self, depth: u32, out: &mut String) {
            let numbers = [
                "0", "1", "2", "7", "2.5", ".5", "3.", "1e3", "4E-2", "1e300",
            ];
            let choice = if depth == 0 { 0 } else { self.below(4) };
            match choice {
                0 => out.push_str(self.pick(&numbers)),
                1 => {
                    out.push('(');
                    self.well_formed(depth - 1, out);
                    out.push(')');
                }
                2 => {
                    out.push_str(self.pick(&["-", "+", " - "]));
                    self.well_formed(depth - 1, out);
                }
                _ => {
                    self.well_formed(depth - 1, out);
                    out.push_str(self.pick(&["+", " - ", "*", "/", " % ", "^", "**"]));
                    self.well_formed(depth - 1, out);
                }
            }
        }
    }

    #[test]
    fn random_inputs_never_panic_and_results_are_finite() {
        let mut rng = Lcg(0x5eed);
        let alphabet: Vec<char> = "0123456789.eE+-*/%^() x_,×".chars().collect();
        for _ in 0..20_000 {
            let len = rng.below(40);
            let junk: String = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect();
            if let Ok(value) = evaluate(&junk) {
                assert!(value.is_finite(), "{junk:?} gave {value}");
            }
        }
        for _ in 0..20_000 {
            let mut expression = String::new();
            rng.well_formed(5, &mut expression);
            match evaluate(&expression) {
                Ok(value) => assert!(value.is_finite(), "{expression:?} gave {value}"),
                Err(CalcError::Arithmetic(_)) => {}
                Err(err @ CalcError::Invalid(_)) => panic!("{expression:?}: {err}"),
            }
        }
    }

    #[test]
    fn manifest_is_strict_deterministic_and_quick() {
        let manifest = Calculate.manifest();
        assert_eq!(manifest.name, "calculate");
        assert!(toolfleet_proto::manifest::is_valid_tool_name(
            &manifest.name
        ));
        assert!(manifest.strict);
        assert_eq!(manifest.effects, Effects::ReadOnly);
        assert_eq!(manifest.timeout_ms, 2_000);
        assert_eq!(manifest.max_attempts, 1);
        assert_eq!(manifest.parameters["required"], json!(["expression"]));
        assert_eq!(manifest.parameters["additionalProperties"], json!(false));
        assert_eq!(
            manifest.parameters["properties"]["expression"]["type"],
            "string"
        );
    }

    #[tokio::test]
    async fn call_returns_integers_when_exact_and_floats_otherwise() {
        let cases = [
            ("2 + 3", json!(5)),
            ("-0", json!(0)),
            ("2 ^ 53", json!(9_007_199_254_740_992_i64)),
            ("-(2 ^ 53)", json!(-9_007_199_254_740_992_i64)),
            ("2 ^ 53 + 2", json!(9_007_199_254_740_994.0)),
            ("1 / 4", json!(0.25)),
            ("1e20", json!(1e20)),
        ];
        for (expression, expected) in cases {
            let data = Calculate
                .call(json!({"expression": expression}), ToolContext::for_test())
                .await
                .unwrap_or_else(|err| panic!("{expression:?}: {err}"));
            assert_eq!(data["expression"], expression);
            assert_eq!(data["result"], expected, "{expression:?}");
            assert_eq!(
                data["result"].is_i64(),
                expected.is_i64(),
                "{expression:?}: integer or float"
            );
        }
    }

    #[tokio::test]
    async fn call_maps_failures_to_terminal_codes() {
        let err = Calculate
            .call(json!({"expression": "2 + x"}), ToolContext::for_test())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ToolError::InvalidArguments(m) if m.contains("'x' at position 4")),
            "{err:?}"
        );
        assert!(!err.is_retryable());

        let err = Calculate
            .call(json!({"expression": "1 / 0"}), ToolContext::for_test())
            .await
            .unwrap_err();
        match &err {
            ToolError::Coded {
                code,
                message,
                retryable: false,
            } => {
                assert_eq!(*code, CALCULATION_ERROR);
                assert!(message.contains("division by zero"), "{message}");
            }
            other => panic!("expected a terminal CALCULATION_ERROR, got {other:?}"),
        }

        let err = Calculate
            .call(json!({"expression": 42}), ToolContext::for_test())
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::InvalidArguments(_)), "{err:?}");
    }
}
