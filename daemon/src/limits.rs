//! Process limits a daemon raises for itself at start.

/// The open-files limit before and after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub before: u64,
    pub now: u64,
    pub hard: u64,
}

/// Raise the soft open-files limit to the hard one. systemd starts services with a soft
/// limit of 1024 whatever `LimitNOFILE` allows, and a controller holds a connection per
/// agent: thousands.
pub fn raise_open_files_limit() -> std::io::Result<OpenFiles> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current.unwrap_or(u64::MAX);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if before < hard {
        setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        )?;
    }
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    Ok(OpenFiles { before, now, hard })
}

/// Raise the limit and say so (a warning when it cannot be raised).
pub fn raise_and_log_open_files_limit() {
    match raise_open_files_limit() {
        Ok(limit) if limit.before != limit.now => tracing::info!(
            from = limit.before,
            to = limit.now,
            "raised the open-files limit to its hard limit"
        ),
        Ok(limit) => tracing::debug!(open_files = limit.now, "open-files limit"),
        Err(error) => tracing::warn!(%error, "could not raise the open-files limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_becomes_the_hard_limit() {
        let limit = raise_open_files_limit().unwrap();
        assert_eq!(limit.now, limit.hard);
        assert!(limit.now >= limit.before);
    }
}
