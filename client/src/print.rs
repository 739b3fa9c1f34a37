//! How the command-line binaries (`gpux`, `gpux-node`, `gpux-testnet`) print: a line at a
//! time to standard output, errors returned rather than panicking, so that `gpux ... | head -1`
//! ends quietly; JSON pretty-printed.

use std::io::Write;

/// Writes a line to standard output, returning the I/O error instead of panicking (a
/// closed pipe, a full disk): the binaries' `main` turns a closed pipe into a quiet exit.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// Prints a value as pretty JSON.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.write_all(b"\n")?;
    Ok(())
}

/// A binary's exit: its code, or `error: ...` (the error's chain on one line) on standard
/// error and exit code 1. Standard output closed by its reader (`gpux ... | head -1`) is no
/// error: whoever read the output has stopped reading, and there is nothing more to say.
pub fn finish(result: anyhow::Result<std::process::ExitCode>) -> std::process::ExitCode {
    match result {
        Ok(code) => code,
        Err(err) if is_broken_pipe(&err) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
