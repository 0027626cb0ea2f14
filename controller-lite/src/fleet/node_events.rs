//! Nodes' events, as Kubernetes' node controller records them: `RegisteredNode` when an
//! agent first registers, `NodeNotReady` when a node is lost (no heartbeat, its link
//! down), `NodeReady` when it is back. Readiness is sampled every few seconds on the
//! leader; the decision ([`transitions`]) is a pure function of two samples.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::events::{Event, EventSink, NODE_NOT_READY, NODE_READY, REGISTERED_NODE, node};
use crate::fleet::nodes::{AWAITING_INVENTORY, NodeRegistry};
use rigger_store::Leadership;

const SAMPLE: Duration = Duration::from_secs(2);

/// Each node's readiness: `None` when ready, else why not.
pub type Readiness = HashMap<String, Option<String>>;

/// The events between two samples of the nodes' readiness.
pub fn transitions(before: &Readiness, after: &Readiness) -> Vec<Event> {
    let mut events = Vec::new();
    let mut names: Vec<&String> = after.keys().collect();
    names.sort();
    for name in names {
        let now = &after[name];
        match (before.get(name), now) {
            (None, _) => events.push(Event {
                regarding: node(name),
                warning: false,
                reason: REGISTERED_NODE,
                message: format!("Node {name} registered"),
            }),
            (Some(Some(_)), None) => events.push(Event {
                regarding: node(name),
                warning: false,
                reason: NODE_READY,
                message: format!("Node {name} status is now: NodeReady"),
            }),
            // Kubernetes' message, constant so that repeats count on one event (why
            // is on the Node's Ready condition).
            (Some(None), Some(_)) => events.push(Event {
                regarding: node(name),
                warning: true,
                reason: NODE_NOT_READY,
                message: format!("Node {name} status is now: NodeNotReady"),
            }),
            _ => {}
        }
    }
    events
}

/// `after` with each node that waits for its agent's inventory (milliseconds after it
/// registered) as it was `before` — not known yet if it was not known: that wait is
/// the registration's second half, not news.
pub fn settled(before: Option<&Readiness>, mut after: Readiness) -> Readiness {
    after.retain(|name, why| {
        if why.as_deref() != Some(AWAITING_INVENTORY) {
            return true;
        }
        match before.and_then(|before| before.get(name)) {
            Some(was) => {
                why.clone_from(was);
                true
            }
            None => false,
        }
    });
    after
}

/// Record the nodes' events while this replica leads, until `token` is cancelled. A
/// replica that takes over starts from the nodes as it finds them; those it holds as
/// not ready then (what it knew when it led before) coming back within one
/// `node_timeout` are agents reconnecting to the new leader, not news. Every node an
/// agent registers with it is `RegisteredNode`, as Kubernetes' node controller tells
/// each node when it starts leading.
pub async fn run(
    nodes: NodeRegistry,
    node_timeout: Duration,
    leadership: Leadership,
    events: Arc<dyn EventSink>,
    token: CancellationToken,
) {
    let mut before: Option<Readiness> = None;
    // Since when this replica leads, and the nodes it held as not ready then.
    let mut took_over: Option<(Instant, HashSet<String>)> = None;
    loop {
        if leadership.is_leader() {
            let after = settled(
                before.as_ref(),
                nodes.readiness(SystemTime::now(), node_timeout),
            );
            let (since, stale) = took_over.get_or_insert_with(|| {
                let stale = after
                    .iter()
                    .filter(|(_, why)| why.is_some())
                    .map(|(name, _)| name.clone())
                    .collect();
                (Instant::now(), stale)
            });
            if since.elapsed() >= node_timeout {
                stale.clear();
            }
            if let Some(before) = &before {
                for event in transitions(before, &after) {
                    let reconnecting =
                        event.reason == NODE_READY && stale.contains(&event.regarding.name);
                    if !reconnecting {
                        events.record(event);
                    }
                }
            }
            before = Some(after);
        } else {
            before = None;
            took_over = None;
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(SAMPLE) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(nodes: &[(&str, Option<&str>)]) -> Readiness {
        nodes
            .iter()
            .map(|(name, why)| ((*name).to_owned(), why.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn a_node_registers_is_lost_and_comes_back() {
        let empty = sample(&[]);
        let ready = sample(&[("n1", None)]);
        let lost = sample(&[("n1", Some("no heartbeat for 31s"))]);
        let reasons = |before: &Readiness, after: &Readiness| -> Vec<(&'static str, String)> {
            transitions(before, after)
                .into_iter()
                .map(|e| (e.reason, e.message))
                .collect()
        };
        assert_eq!(
            reasons(&empty, &ready),
            [(REGISTERED_NODE, "Node n1 registered".to_owned())]
        );
        assert_eq!(reasons(&ready, &ready), []);
        assert_eq!(
            reasons(&ready, &lost),
            [(
                NODE_NOT_READY,
                "Node n1 status is now: NodeNotReady".to_owned()
            )]
        );
        assert_eq!(reasons(&lost, &lost), []);
        assert_eq!(
            reasons(&lost, &ready),
            [(NODE_READY, "Node n1 status is now: NodeReady".to_owned())]
        );
        // A node forgotten tells nothing more.
        assert_eq!(reasons(&ready, &empty), []);
    }

    #[test]
    fn the_wait_for_an_inventory_is_no_news() {
        let waiting = sample(&[("n1", Some(AWAITING_INVENTORY))]);
        let ready = sample(&[("n1", None)]);
        let lost = sample(&[("n1", Some("agent disconnected"))]);
        // Registering: not known until the inventory came.
        assert_eq!(settled(Some(&sample(&[])), waiting.clone()), sample(&[]));
        assert_eq!(settled(None, waiting.clone()), sample(&[]));
        // Reconnecting at once: as it was, ready, and no NotReady/Ready pair.
        assert_eq!(settled(Some(&ready), waiting.clone()), ready);
        // Back after being lost: still lost until the inventory came, then NodeReady.
        assert_eq!(settled(Some(&lost), waiting), lost);
        assert_eq!(settled(Some(&lost), ready.clone()), ready);
        // Other reasons are news as ever.
        assert_eq!(settled(Some(&ready), lost.clone()), lost);
    }
}
