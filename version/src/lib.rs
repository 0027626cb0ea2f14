//! Rigger's release as its binaries name it, and the version skew policy
//! (`docs/operator-guide.md`, "Upgrades and version skew") as a pure decision.
//!
//! Versions are semantic versions; a *release line* is a major and minor version (`0.2`),
//! and as in Kubernetes the skew is counted in release lines: a controller accepts agents
//! of its own line, the line before it (a fleet upgraded controller first, agents node by
//! node) and the line after it (the controller rolled back one release while the agents
//! are not yet).

use std::fmt;

/// This build's version (the workspace's, `Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this build was made from (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("RIGGER_COMMIT");

/// What `--version` prints after the program's name: `0.2.0 (commit 0123456789ab)`.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RIGGER_COMMIT"),
    ")"
);

/// How many release lines an agent may be behind or ahead of its controller.
pub const LINES_OF_SKEW: u64 = 1;

/// A major and minor version: what the skew policy counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReleaseLine {
    pub major: u64,
    pub minor: u64,
}

impl fmt::Display for ReleaseLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl ReleaseLine {
    /// The line of `version` (`0.2.1-rc.1` is on `0.2`), `None` when it is no semantic
    /// version.
    pub fn of(version: &str) -> Option<Self> {
        let version = semver::Version::parse(version.trim_start_matches('v')).ok()?;
        Some(Self {
            major: version.major,
            minor: version.minor,
        })
    }
}

/// Why a controller refuses an agent; names both versions and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkewRefusal {
    /// The agent's version is no semantic version (an agent built oddly, or no agent).
    Unreadable { agent: String, controller: String },
    /// Older than the line before the controller's: upgrade the agent.
    TooOld {
        agent: String,
        controller: String,
        oldest: ReleaseLine,
    },
    /// Newer than the line after the controller's: upgrade the controller first.
    TooNew {
        agent: String,
        controller: String,
        newest: ReleaseLine,
    },
}

impl SkewRefusal {
    /// A short CamelCase reason, as a Kubernetes condition's.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unreadable { .. } => "AgentVersionUnreadable",
            Self::TooOld { .. } => "AgentVersionTooOld",
            Self::TooNew { .. } => "AgentVersionTooNew",
        }
    }
}

impl fmt::Display for SkewRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable { agent, controller } => write!(
                f,
                "agent version `{agent}` is no semantic version; controller {controller} accepts agents of its release line and the one either side of it"
            ),
            Self::TooOld {
                agent,
                controller,
                oldest,
            } => write!(
                f,
                "agent {agent} is older than controller {controller} accepts (release {oldest} at least): upgrade the agent"
            ),
            Self::TooNew {
                agent,
                controller,
                newest,
            } => write!(
                f,
                "agent {agent} is newer than controller {controller} accepts (release {newest} at most): upgrade the controller first"
            ),
        }
    }
}

impl std::error::Error for SkewRefusal {}

/// Whether a controller of version `controller` accepts an agent of version `agent`:
/// the same major version, and a minor version at most [`LINES_OF_SKEW`] away. Pure.
pub fn check_agent(controller: &str, agent: &str) -> Result<(), SkewRefusal> {
    let (Some(ours), Some(theirs)) = (ReleaseLine::of(controller), ReleaseLine::of(agent)) else {
        return Err(SkewRefusal::Unreadable {
            agent: agent.to_owned(),
            controller: controller.to_owned(),
        });
    };
    let oldest = ReleaseLine {
        major: ours.major,
        minor: ours.minor.saturating_sub(LINES_OF_SKEW),
    };
    let newest = ReleaseLine {
        major: ours.major,
        minor: ours.minor.saturating_add(LINES_OF_SKEW),
    };
    if theirs < oldest {
        return Err(SkewRefusal::TooOld {
            agent: agent.to_owned(),
            controller: controller.to_owned(),
            oldest,
        });
    }
    if theirs > newest {
        return Err(SkewRefusal::TooNew {
            agent: agent.to_owned(),
            controller: controller.to_owned(),
            newest,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_line_before_and_after_are_accepted() {
        for agent in ["0.1.0", "0.1.7", "0.2.0", "0.2.3", "0.3.0-rc.1", "v0.2.0"] {
            assert_eq!(check_agent("0.2.0", agent), Ok(()), "{agent}");
        }
    }

    #[test]
    fn further_lines_and_other_majors_are_refused_naming_both_versions() {
        let old = check_agent("0.3.1", "0.1.9").unwrap_err();
        assert_eq!(old.reason(), "AgentVersionTooOld");
        assert_eq!(
            old.to_string(),
            "agent 0.1.9 is older than controller 0.3.1 accepts (release 0.2 at least): upgrade the agent"
        );
        let new = check_agent("0.2.0", "0.4.0").unwrap_err();
        assert_eq!(new.reason(), "AgentVersionTooNew");
        assert!(new.to_string().contains("agent 0.4.0"), "{new}");
        assert!(new.to_string().contains("controller 0.2.0"), "{new}");
        assert!(check_agent("1.0.0", "0.9.0").is_err());
        assert!(check_agent("0.9.0", "1.0.0").is_err());
    }

    #[test]
    fn a_version_that_is_none_is_refused() {
        for agent in ["", "bench", "0.2", "latest"] {
            let refusal = check_agent("0.2.0", agent).unwrap_err();
            assert_eq!(refusal.reason(), "AgentVersionUnreadable", "{agent}");
        }
    }

    #[test]
    fn the_build_names_a_version_and_a_commit() {
        assert!(ReleaseLine::of(VERSION).is_some());
        assert!(LONG.starts_with(VERSION));
        assert!(COMMIT == "unknown" || COMMIT.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
