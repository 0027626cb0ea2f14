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

/// What `completion` and `manpage` subcommands print: shell completions or a man page
/// (roff) for the binary whose clap command is `command`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum DocsCommand {
    /// Print shell completions, e.g. `completion bash > /etc/bash_completion.d/NAME`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `manpage > /usr/share/man/man1/NAME.1`.
    Manpage,
}

impl DocsCommand {
    pub fn print(&self, mut command: clap::Command) -> std::process::ExitCode {
        use std::io::Write as _;
        let name = command.get_name().to_owned();
        // Rendered into memory first: the generators panic on a failed write (a closed
        // pipe), a write of our own reports it.
        let mut text = Vec::new();
        let rendered = match self {
            Self::Completion { shell } => {
                clap_complete::generate(*shell, &mut command, name.clone(), &mut text);
                Ok(())
            }
            Self::Manpage => clap_mangen::Man::new(command).render(&mut text),
        };
        let written = rendered.and_then(|()| std::io::stdout().write_all(&text));
        match written {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name}: error: {e}");
                std::process::ExitCode::FAILURE
            }
        }
    }
}
