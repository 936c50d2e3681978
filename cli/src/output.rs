//! Standard output that ends quietly when the reader goes away:
//! `toolfleet submit x --watch | head -1` must not panic, as `println!`
//! does on a closed pipe. `outln!` and `out!` return the write's
//! `io::Result`; a command returns it with `?`, and the binary exits 0 on
//! [`is_broken_pipe`].

use std::io;

/// `println!` to standard output, returning the write's result. Exported
/// for the bench (`toolfleet-bench`), as `output::outln`.
#[doc(hidden)]
#[macro_export]
macro_rules! __outln {
    () => {
        $crate::output::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` to standard output, returning the write's result.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*))
    };
}

pub use __outln as outln;
pub(crate) use out;

/// Writes and flushes (a watched job's events must show as they happen).
pub fn write(text: std::fmt::Arguments<'_>) -> io::Result<()> {
    use io::Write as _;
    let mut stdout = io::stdout().lock();
    stdout.write_fmt(text)?;
    stdout.flush()
}

/// Whether `err` says the reader of standard output has gone away.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}
