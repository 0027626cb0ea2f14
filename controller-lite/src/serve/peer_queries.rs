//! The registry mirrors' questions (PeerQuery: which nodes may this node fetch image D
//! from?), gated before any work: each answer walks every job and signs grants, and an
//! agent is outside input — a compromised one can bypass its own mirror and ask as fast
//! as its link carries. So each node has an allowance of questions, and a question
//! answered "nobody" is answered so again, without the walk, for a while.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Questions per second a node may ask, sustained: a pull through the mirror asks once
/// per image (its documents name the rest), so this is many pulls at once.
const PER_SECOND: NonZeroU32 = nonzero(10);
/// Questions a node may ask at once.
const BURST: NonZeroU32 = nonzero(40);
/// How long "nobody" is the answer without looking again.
const NOBODY_TTL: Duration = Duration::from_secs(10);
/// Questions remembered as "nobody", at most (all forgotten when full).
const REMEMBERED: usize = 4096;

const fn nonzero(n: u32) -> NonZeroU32 {
    match NonZeroU32::new(n) {
        Some(n) => n,
        None => NonZeroU32::MIN,
    }
}

/// What a question is about: one node asking for one image of one repository.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Question {
    pub node: String,
    pub image: String,
    pub repository: String,
    pub registry: String,
}

/// Whether a question is looked into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Look for peers.
    Look,
    /// The node asks faster than its allowance: "nobody".
    Limited,
    /// Answered "nobody" a moment ago: "nobody" again.
    KnownNobody,
}

#[derive(Debug)]
pub struct PeerQueryGate {
    limiter: DefaultKeyedRateLimiter<String>,
    nobody: Mutex<HashMap<Question, Instant>>,
}

impl Default for PeerQueryGate {
    fn default() -> Self {
        Self {
            limiter: RateLimiter::keyed(Quota::per_second(PER_SECOND).allow_burst(BURST)),
            nobody: Mutex::default(),
        }
    }
}

impl PeerQueryGate {
    /// Whether `question`, asked at `now`, is looked into.
    pub fn admit(&self, question: &Question, now: Instant) -> Admission {
        if self.limiter.check_key(&question.node).is_err() {
            return Admission::Limited;
        }
        let nobody = self
            .nobody
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match nobody.get(question) {
            Some(at) if now.saturating_duration_since(*at) < NOBODY_TTL => Admission::KnownNobody,
            _ => Admission::Look,
        }
    }

    /// `question` was looked into at `now` and `found` peers or none.
    pub fn answered(&self, question: Question, found: bool, now: Instant) {
        let mut nobody = self
            .nobody
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if found {
            nobody.remove(&question);
            return;
        }
        if nobody.len() >= REMEMBERED {
            nobody.clear();
        }
        nobody.insert(question, now);
    }

    /// Forget nodes back at full allowance.
    pub fn forget_idle(&self) {
        self.limiter.retain_recent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(node: &str, image: &str) -> Question {
        Question {
            node: node.to_owned(),
            image: image.to_owned(),
            repository: "team/app".to_owned(),
            registry: "registry.example".to_owned(),
        }
    }

    #[test]
    fn a_flood_from_one_node_is_cut_off_without_costing_the_others() {
        let gate = PeerQueryGate::default();
        let now = Instant::now();
        let mut looked = 0;
        for i in 0..1000 {
            if gate.admit(&question("liar", &format!("sha256:{i}")), now) == Admission::Look {
                looked += 1;
            }
        }
        assert!(looked <= BURST.get() as usize + 1, "{looked}");
        assert_eq!(
            gate.admit(&question("honest", "sha256:x"), now),
            Admission::Look
        );
    }

    #[test]
    fn nobody_is_remembered_for_a_while_and_peers_are_not() {
        let gate = PeerQueryGate::default();
        let now = Instant::now();
        let asked = question("n", "sha256:a");
        gate.answered(asked.clone(), false, now);
        assert_eq!(gate.admit(&asked, now), Admission::KnownNobody);
        assert_eq!(
            gate.admit(&asked, now + NOBODY_TTL + Duration::from_secs(1)),
            Admission::Look
        );
        gate.answered(asked.clone(), true, now);
        assert_eq!(gate.admit(&asked, now), Admission::Look);
        // Another node asking the same is its own question.
        gate.answered(asked, false, now);
        assert_eq!(gate.admit(&question("m", "sha256:a"), now), Admission::Look);
    }
}
