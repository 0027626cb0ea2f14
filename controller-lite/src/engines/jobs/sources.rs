//! Where a job's pulls fetch from (fleet distribution), without I/O: the job's nodes
//! that serve peers and hold the image, or are pulling it and have resolved it (their
//! blobs are served as they arrive), come before the registry. While no node has
//! resolved the image yet, one node (the seed) pulls it from the registry and the rest
//! wait for it — a second or so, not the whole pull — instead of all asking the
//! registry at once.
//!
//! A node is never planned as a source of a node it fetches from (its own task's
//! sources): two pulls each waiting for the other's bytes would stall.
//!
//! Every node is outside input for every other: what a node reports (that it holds
//! the image, its digest, whom it suspects) only orders whom the others ask, never what
//! they take. A node's suspects are left out of its own plan only, so a liar naming
//! every honest holder a suspect costs nobody but itself; a holder claim puts a node
//! first in some plans, and each pull that asks it and is let down leaves it after one
//! judged window (the agents' `peer_min_rate`) or one wrong blob.

use std::collections::{BTreeSet, HashMap};

use rigger_api::image_pull_job::{NodePullPhase, NodePullStatus};

use super::state::NodeRun;
use crate::fleet::nodes::NodeView;

/// Peers one task names at most (each one more the pull can fall back on before the
/// registry).
const MAX_SOURCES: usize = 3;

/// A node a pull may fetch from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Source {
    pub(super) node: String,
    pub(super) address: String,
    /// The digest the node says the image's name pointed at: decides nothing for
    /// another node (grants name the job's reference), only whom a mirror asks.
    pub(super) reported_digest: String,
    /// The node holds the whole image (else it is pulling it: its blobs arrive).
    pub(super) complete: bool,
}

/// The peer address of `node` when it is ready and serves peers.
fn serving<'a>(views: &'a HashMap<String, NodeView>, node: &str) -> Option<&'a str> {
    let view = views.get(node)?;
    if view.not_ready.is_some() {
        return None;
    }
    view.peer_address.as_deref()
}

/// The job's nodes that serve peers and hold the image or have resolved it while
/// pulling, by name.
pub(super) fn holders(
    entries: &[NodePullStatus],
    views: &HashMap<String, NodeView>,
) -> Vec<Source> {
    entries
        .iter()
        .filter(|e| {
            matches!(e.phase, NodePullPhase::Succeeded | NodePullPhase::Pulling)
                && !e.image_digest.is_empty()
        })
        .filter_map(|e| {
            Some(Source {
                node: e.name.clone(),
                address: serving(views, &e.name)?.to_owned(),
                reported_digest: e.image_digest.clone(),
                complete: e.phase == NodePullPhase::Succeeded,
            })
        })
        .collect()
}

/// `node`, just sent its pull, as a source for nodes sent after it: it will hold the
/// image too (it fetches from the holders). `None` when it does not serve peers, or
/// nobody holds the image yet (then it seeds).
pub(super) fn just_sent(
    holders: &[Source],
    views: &HashMap<String, NodeView>,
    node: &str,
) -> Option<Source> {
    if holders.is_empty() {
        return None;
    }
    Some(Source {
        node: node.to_owned(),
        address: serving(views, node)?.to_owned(),
        reported_digest: String::new(),
        complete: false,
    })
}

/// Nodes fetching from one node still pulling, as their first source, at most: past
/// this, the next node fetches from another one (a tree, not a star on one uplink).
const MAX_FANOUT: usize = 8;

/// The sources of the `turn`-th pull dispatched on `node`: up to [`MAX_SOURCES`] of
/// `holders` other than the node itself, those fetching from it (`runs`: each
/// node's planned sources, as its task names them) and those it suspects itself (`suspected`:
/// its own reports only). Nodes holding the whole image come first,
/// starting at a different one each turn so the fleet's pulls spread over them; then
/// nodes still pulling, in `holders`' order (the ones that have resolved the image
/// before those just sent), the first with room for one more ([`MAX_FANOUT`]) first:
/// the rest are the pull's fallbacks should its source die.
pub(super) fn sources_for(
    holders: &[Source],
    node: &str,
    turn: usize,
    runs: &HashMap<String, NodeRun>,
    suspected: Option<&BTreeSet<String>>,
) -> Vec<Source> {
    let fetches_from_node = |source: &Source| {
        !source.complete
            && runs
                .get(&source.node)
                .is_some_and(|theirs| theirs.planned.iter().any(|n| n == node))
    };
    let others = holders.iter().filter(|s| {
        s.node != node
            && !fetches_from_node(s)
            && !suspected.is_some_and(|suspects| suspects.contains(&s.node))
    });
    let (complete, mut arriving): (Vec<&Source>, Vec<&Source>) = others.partition(|s| s.complete);
    let mut sources: Vec<Source> = (0..complete.len())
        .map(|i| complete[(turn + i) % complete.len()].clone())
        .collect();
    let fanout = |source: &Source| {
        runs.iter()
            .filter(|(planned_node, theirs)| {
                planned_node.as_str() != node && theirs.planned.first() == Some(&source.node)
            })
            .count()
    };
    if let Some(roomy) = arriving.iter().position(|s| fanout(s) < MAX_FANOUT) {
        let first = arriving.remove(roomy);
        arriving.insert(0, first);
    }
    sources.extend(arriving.into_iter().cloned());
    sources.truncate(MAX_SOURCES);
    sources
}

/// Where `node`'s containerd may fetch `image` from through its agent's registry mirror
/// (kubelet's own pulls), by one job: the job's holders of that image, when the job
/// names `node` — its selector is the operator's word that the node may have the
/// image. Any other node gets nothing.
pub(super) fn mirror_sources(
    entries: &[NodePullStatus],
    views: &HashMap<String, NodeView>,
    suspected: Option<&BTreeSet<String>>,
    runs: &HashMap<String, NodeRun>,
    node: &str,
    image: &str,
) -> Vec<Source> {
    if !entries.iter().any(|e| e.name == node) {
        return Vec::new();
    }
    let holders: Vec<Source> = holders(entries, views)
        .into_iter()
        .filter(|s| s.reported_digest == image)
        .collect();
    sources_for(&holders, node, 0, runs, suspected)
}

/// How the job's waiting nodes go out, given who holds the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fanout {
    /// Every node as parallelism allows (sharing off, a holder exists, or no node of the
    /// job serves peers).
    Open,
    /// No holder yet: only a node that serves peers may start (and only while none is
    /// pulling); the others wait until it has resolved the image, then fetch from it.
    Seed { seed_pulling: bool },
}

/// How long the others wait for a seed to resolve the image: past this, a seed that
/// says nothing (slow, or lying by silence) holds nobody back.
pub(super) const SEED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// How the job's waiting nodes may start now; `seed_overdue`: a node has been pulling
/// for [`SEED_PATIENCE`] without resolving the image.
pub(super) fn fanout(
    sharing: bool,
    entries: &[NodePullStatus],
    holders: &[Source],
    views: &HashMap<String, NodeView>,
    seed_overdue: bool,
) -> Fanout {
    if !sharing || !holders.is_empty() || entries.len() < 2 || seed_overdue {
        return Fanout::Open;
    }
    // Nodes that could still become the first holder.
    let candidates = entries.iter().filter(|e| {
        matches!(e.phase, NodePullPhase::Waiting | NodePullPhase::Pulling)
            && serving(views, &e.name).is_some()
    });
    let mut any = false;
    let mut seed_pulling = false;
    for candidate in candidates {
        any = true;
        seed_pulling |= candidate.phase == NodePullPhase::Pulling;
    }
    if any {
        Fanout::Seed { seed_pulling }
    } else {
        Fanout::Open
    }
}

/// Whether `node`, waiting, may start under `fanout`.
pub(super) fn may_start(fanout: Fanout, views: &HashMap<String, NodeView>, node: &str) -> bool {
    match fanout {
        Fanout::Open => true,
        Fanout::Seed { seed_pulling } => !seed_pulling && serving(views, node).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;

    fn view(address: Option<&str>, ready: bool) -> NodeView {
        NodeView {
            labels: BTreeMap::new(),
            credential_labels: BTreeMap::new(),
            not_ready: (!ready).then(|| "link down".to_owned()),
            pod_labels: Vec::new(),
            images: None,
            peer_address: address.map(Arc::from),
        }
    }

    fn entry(name: &str, phase: NodePullPhase, digest: &str) -> NodePullStatus {
        NodePullStatus {
            name: name.to_owned(),
            phase,
            image_digest: digest.to_owned(),
            ..NodePullStatus::default()
        }
    }

    fn views(nodes: &[(&str, Option<&str>, bool)]) -> HashMap<String, NodeView> {
        nodes
            .iter()
            .map(|(n, a, r)| ((*n).to_owned(), view(*a, *r)))
            .collect()
    }

    #[test]
    fn holders_are_ready_serving_nodes_that_pulled_the_image() {
        let views = views(&[
            ("a", Some("10.0.0.1:9441"), true),
            ("b", Some("10.0.0.2:9441"), false),
            ("c", None, true),
            ("d", Some("10.0.0.4:9441"), true),
            ("e", Some("10.0.0.5:9441"), true),
        ]);
        let entries = [
            entry("a", NodePullPhase::Succeeded, "sha256:1"),
            entry("b", NodePullPhase::Succeeded, "sha256:1"),
            entry("c", NodePullPhase::Succeeded, "sha256:1"),
            entry("d", NodePullPhase::Pulling, ""),
            entry("e", NodePullPhase::Succeeded, ""),
            entry("f", NodePullPhase::Pulling, "sha256:1"),
            entry("g", NodePullPhase::Waiting, "sha256:1"),
            entry("h", NodePullPhase::Failed, "sha256:1"),
        ];
        let mut more = views;
        for (name, address) in [("f", "10.0.0.6:9441"), ("g", "g:1"), ("h", "h:1")] {
            more.insert(name.to_owned(), view(Some(address), true));
        }
        let holders = holders(&entries, &more);
        assert_eq!(
            holders,
            vec![
                Source {
                    node: "a".to_owned(),
                    address: "10.0.0.1:9441".to_owned(),
                    reported_digest: "sha256:1".to_owned(),
                    complete: true,
                },
                // Pulling and resolved: its blobs are served as they arrive.
                Source {
                    node: "f".to_owned(),
                    address: "10.0.0.6:9441".to_owned(),
                    reported_digest: "sha256:1".to_owned(),
                    complete: false,
                }
            ]
        );
    }

    #[test]
    fn successive_pulls_start_at_different_holders_and_never_at_themselves() {
        let holders: Vec<Source> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| source(n, true))
            .collect();
        let none: HashMap<String, NodeRun> = HashMap::new();
        let plan = |node, turn| names(sources_for(&holders, node, turn, &none, None));
        assert_eq!(plan("x", 0), ["a", "b", "c"]);
        assert_eq!(plan("x", 1), ["b", "c", "d"]);
        assert_eq!(plan("x", 3), ["d", "a", "b"]);
        assert_eq!(plan("b", 1), ["c", "d", "a"]);
        assert!(sources_for(&holders[..1], "a", 0, &none, None).is_empty());
    }

    #[test]
    fn a_nodes_suspects_are_left_out_of_its_own_plan_only() {
        let holders: Vec<Source> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| source(n, true))
            .collect();
        let none: HashMap<String, NodeRun> = HashMap::new();
        // x (a liar, or a node let down) suspects every holder but d.
        let suspects = BTreeSet::from(["a".to_owned(), "b".to_owned(), "c".to_owned()]);
        assert_eq!(
            names(sources_for(&holders, "x", 0, &none, Some(&suspects))),
            ["d"]
        );
        // Nobody else's plan changes.
        assert_eq!(
            names(sources_for(&holders, "y", 0, &none, None)),
            ["a", "b", "c"]
        );
    }

    fn source(node: &str, complete: bool) -> Source {
        Source {
            node: node.to_owned(),
            address: format!("{node}:9441"),
            reported_digest: "sha256:1".to_owned(),
            complete,
        }
    }

    fn names(sources: Vec<Source>) -> Vec<String> {
        sources.into_iter().map(|s| s.node).collect()
    }

    #[test]
    fn whole_copies_come_first_and_no_two_pulls_fetch_from_each_other() {
        let holders = vec![
            source("seed", false),
            source("f1", false),
            source("done", true),
        ];
        let none: HashMap<String, NodeRun> = HashMap::new();
        assert_eq!(
            names(sources_for(&holders, "x", 1, &none, None)),
            ["done", "seed", "f1"]
        );
        // f1 fetches from x (x's earlier attempt): x may not fetch from f1 while f1 is
        // still pulling; once f1 holds the whole image, it may.
        let planned = HashMap::from([(
            "f1".to_owned(),
            NodeRun {
                planned: vec!["x".to_owned()],
                ..NodeRun::default()
            },
        )]);
        assert_eq!(
            names(sources_for(&holders, "x", 0, &planned, None)),
            ["done", "seed"]
        );
        let f1_done = vec![source("seed", false), source("f1", true)];
        assert_eq!(
            names(sources_for(&f1_done, "x", 0, &planned, None)),
            ["f1", "seed"]
        );
    }

    #[test]
    fn one_serving_node_seeds_while_the_others_wait() {
        let views = views(&[
            ("a", None, true),
            ("b", Some("b:9441"), true),
            ("c", Some("c:9441"), true),
        ]);
        let waiting = |n| entry(n, NodePullPhase::Waiting, "");
        let mut entries = vec![waiting("a"), waiting("b"), waiting("c")];
        // Nobody holds the image: only a serving node may start.
        let fan = fanout(true, &entries, &[], &views, false);
        assert_eq!(
            fan,
            Fanout::Seed {
                seed_pulling: false
            }
        );
        assert!(!may_start(fan, &views, "a"));
        assert!(may_start(fan, &views, "b"));
        // b pulls: everyone else waits until it has resolved the image.
        entries[1].phase = NodePullPhase::Pulling;
        let fan = fanout(true, &entries, &[], &views, false);
        assert!(!may_start(fan, &views, "c") && !may_start(fan, &views, "a"));
        // A seed that says nothing for SEED_PATIENCE holds nobody back.
        assert_eq!(fanout(true, &entries, &[], &views, true), Fanout::Open);
        // b has resolved it: all go (from b, as its blobs arrive).
        entries[1].image_digest = "sha256:1".to_owned();
        let arriving = holders(&entries, &views);
        assert_eq!(
            fanout(true, &entries, &arriving, &views, false),
            Fanout::Open
        );
        // b has it: all go (from b).
        entries[1] = entry("b", NodePullPhase::Succeeded, "sha256:1");
        let holders = holders(&entries, &views);
        assert_eq!(
            fanout(true, &entries, &holders, &views, false),
            Fanout::Open
        );
        // Sharing off, or no node serving peers: as before, everyone at once.
        let plain = vec![waiting("a"), waiting("b")];
        assert_eq!(fanout(false, &plain, &[], &views, false), Fanout::Open);
        let unserved = views_without_peers();
        assert_eq!(fanout(true, &plain, &[], &unserved, false), Fanout::Open);
        // The seed failed and no serving node is left to seed: everyone goes.
        let failed = vec![
            waiting("a"),
            entry("b", NodePullPhase::Failed, ""),
            entry("c", NodePullPhase::Failed, ""),
        ];
        assert_eq!(fanout(true, &failed, &[], &views, false), Fanout::Open);
    }

    #[test]
    fn nodes_still_pulling_fan_out_as_a_tree_with_the_others_as_fallbacks() {
        let holders: Vec<Source> = ["seed", "f1", "f2", "f3"]
            .iter()
            .map(|n| source(n, false))
            .collect();
        let mut planned: HashMap<String, NodeRun> = HashMap::new();
        // The seed serves the first MAX_FANOUT nodes first; the rest of the holders
        // are their fallbacks.
        for i in 0..MAX_FANOUT {
            let node = format!("n{i}");
            let sources = sources_for(&holders, &node, i, &planned, None);
            assert_eq!(names(sources.clone()), ["seed", "f1", "f2"], "{node}");
            planned.insert(
                node,
                NodeRun {
                    planned: names(sources),
                    ..NodeRun::default()
                },
            );
        }
        // Then the next holder with room.
        let next = sources_for(&holders, "late", 0, &planned, None);
        assert_eq!(names(next), ["f1", "seed", "f2"]);
    }

    #[test]
    fn a_node_just_sent_backs_up_the_holders_when_it_serves_peers() {
        let views = views(&[("a", Some("a:1"), true), ("b", None, true)]);
        let holders = vec![source("seed", false)];
        assert_eq!(
            just_sent(&holders, &views, "a"),
            Some(Source {
                node: "a".to_owned(),
                address: "a:1".to_owned(),
                reported_digest: String::new(),
                complete: false,
            })
        );
        assert_eq!(just_sent(&holders, &views, "b"), None);
        assert_eq!(just_sent(&[], &views, "a"), None);
    }

    #[test]
    fn a_mirror_gets_holders_of_the_image_only_for_a_node_the_job_names() {
        let views = views(&[("a", Some("a:1"), true), ("b", Some("b:1"), true)]);
        let entries = [
            entry("a", NodePullPhase::Succeeded, "sha256:1"),
            entry("b", NodePullPhase::Waiting, ""),
        ];
        let none: HashMap<String, NodeRun> = HashMap::new();
        let for_node =
            |node, image| names(mirror_sources(&entries, &views, None, &none, node, image));
        assert_eq!(for_node("b", "sha256:1"), ["a"]);
        // Another image, or a node the job does not name: nothing.
        assert!(for_node("b", "sha256:2").is_empty());
        assert!(for_node("z", "sha256:1").is_empty());
        // A node is never its own source.
        assert!(for_node("a", "sha256:1").is_empty());
    }

    fn views_without_peers() -> HashMap<String, NodeView> {
        views(&[("a", None, true), ("b", None, true)])
    }
}
