//! Command-line edges shared by Rigger's binaries.

use std::process::ExitCode;

use crate::config::EXIT_BAD_CONFIG;

/// Parse the command line. `--help`/`--version` print and exit 0; a usage error prints
/// clap's message and exits 64, like a refused configuration.
pub fn parse_args<T: clap::Parser>() -> Result<T, ExitCode> {
    T::try_parse().map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(EXIT_BAD_CONFIG as u8)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Print `PROGRAM: error: CAUSE` on one line and return the configuration exit status.
pub fn refuse_config(program: &str, error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("{program}: error: {error}");
    ExitCode::from(EXIT_BAD_CONFIG as u8)
}
