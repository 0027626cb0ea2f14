//! Which connections the webhook takes. Anyone on the pod network can connect to it, and
//! with `failurePolicy: Fail` a webhook the API server cannot reach refuses every pod a
//! SidecarSet matches: no address may hold the slots the API server needs.
//!
//! - An address has a share of its own (connections, and TLS handshakes in flight),
//!   checked before the table as a whole: one address never fills it.
//! - When the table is full, a newcomer takes the oldest slot of the address holding the
//!   most, if that address holds at least two more than the newcomer's: the API server,
//!   with its few connections, always finds one while others hold many idle ones.
//!
//! [`decide`] is the decision, pure; [`Connections`] keeps the table it decides on.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

/// How many connections the webhook keeps, in all and per address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_address: usize,
    /// TLS handshakes in flight from one address (a handshake is the cheap way to hold a
    /// slot: a bare TCP connection that never speaks).
    pub handshakes_per_address: usize,
}

/// What one address holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub connections: usize,
    pub handshaking: usize,
}

/// Whether a new connection is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Take,
    /// Taken in the place of the oldest connection of this address.
    TakeEvicting(IpAddr),
    Refuse(&'static str),
}

/// The decision for a connection from `from`, given what every address holds.
pub fn decide(held: &HashMap<IpAddr, Held>, from: IpAddr, limits: Limits) -> Decision {
    let own = held.get(&from).copied().unwrap_or_default();
    if own.handshaking >= limits.handshakes_per_address {
        return Decision::Refuse("too many TLS handshakes in flight from this address");
    }
    if own.connections >= limits.per_address {
        return Decision::Refuse("too many connections from this address");
    }
    let total: usize = held.values().map(|h| h.connections).sum();
    if total < limits.total {
        return Decision::Take;
    }
    // Full: the biggest holder gives way, if it holds more than the newcomer would.
    let biggest = held
        .iter()
        .filter(|(address, _)| **address != from)
        .max_by_key(|(address, h)| (h.connections, std::cmp::Reverse(**address)));
    match biggest {
        Some((address, h)) if h.connections > own.connections + 1 => {
            Decision::TakeEvicting(*address)
        }
        _ => Decision::Refuse("every connection slot is taken"),
    }
}

/// One connection in the table.
#[derive(Debug)]
struct Open {
    id: u64,
    handshaking: bool,
    /// Cancelled when it is evicted: its task closes it.
    evicted: CancellationToken,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    /// Each address's connections, oldest first.
    open: HashMap<IpAddr, Vec<Open>>,
    held: HashMap<IpAddr, Held>,
}

/// The webhook's connections (cheap to clone).
#[derive(Debug, Clone)]
pub struct Connections {
    limits: Limits,
    table: Arc<Mutex<Table>>,
}

/// A connection's place in the table, given up when dropped.
#[derive(Debug)]
pub struct Slot {
    table: Arc<Mutex<Table>>,
    address: IpAddr,
    id: u64,
    /// Cancelled when another connection takes this one's place.
    pub evicted: CancellationToken,
}

impl Connections {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            table: Arc::default(),
        }
    }

    /// A slot for a connection from `from` (handshaking), or why there is none.
    pub fn take(&self, from: IpAddr) -> Result<Slot, &'static str> {
        let mut table = lock(&self.table);
        match decide(&table.held, from, self.limits) {
            Decision::Refuse(why) => return Err(why),
            Decision::Take => {}
            Decision::TakeEvicting(victim) => table.evict_oldest(victim),
        }
        table.next_id += 1;
        let id = table.next_id;
        let evicted = CancellationToken::new();
        table.open.entry(from).or_default().push(Open {
            id,
            handshaking: true,
            evicted: evicted.clone(),
        });
        let held = table.held.entry(from).or_default();
        held.connections += 1;
        held.handshaking += 1;
        Ok(Slot {
            table: self.table.clone(),
            address: from,
            id,
            evicted,
        })
    }

    /// What `address` holds now.
    pub fn held(&self, address: IpAddr) -> Held {
        lock(&self.table)
            .held
            .get(&address)
            .copied()
            .unwrap_or_default()
    }
}

impl Slot {
    /// Its TLS handshake is done: it no longer counts as one in flight.
    pub fn handshaken(&self) {
        let mut table = lock(&self.table);
        let Table { open, held, .. } = &mut *table;
        if let Some(connection) = open
            .get_mut(&self.address)
            .and_then(|all| all.iter_mut().find(|c| c.id == self.id))
            && connection.handshaking
        {
            connection.handshaking = false;
            if let Some(held) = held.get_mut(&self.address) {
                held.handshaking = held.handshaking.saturating_sub(1);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.table).remove(self.address, self.id);
    }
}

impl Table {
    fn evict_oldest(&mut self, address: IpAddr) {
        // A connection still in its handshake goes first: it has sent nothing yet.
        let Some(all) = self.open.get(&address) else {
            return;
        };
        let victim = all
            .iter()
            .find(|c| c.handshaking)
            .or_else(|| all.first())
            .map(|c| (c.id, c.evicted.clone()));
        if let Some((id, evicted)) = victim {
            evicted.cancel();
            self.remove(address, id);
        }
    }

    /// Forget connection `id` (once: an evicted one is forgotten when evicted, and its
    /// slot's drop then finds nothing).
    fn remove(&mut self, address: IpAddr, id: u64) {
        let Some(all) = self.open.get_mut(&address) else {
            return;
        };
        let Some(index) = all.iter().position(|c| c.id == id) else {
            return;
        };
        let gone = all.remove(index);
        if all.is_empty() {
            self.open.remove(&address);
        }
        if let Some(held) = self.held.get_mut(&address) {
            held.connections = held.connections.saturating_sub(1);
            if gone.handshaking {
                held.handshaking = held.handshaking.saturating_sub(1);
            }
            if held.connections == 0 {
                self.held.remove(&address);
            }
        }
    }
}

/// The table is left consistent by every holder of the lock (no code in it panics), so
/// a poisoned lock is taken as it is.
fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const LIMITS: Limits = Limits {
        total: 8,
        per_address: 4,
        handshakes_per_address: 2,
    };

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn an_address_is_held_to_its_share_before_the_table_is_counted() {
        let held = HashMap::from([(
            ip(1),
            Held {
                connections: 4,
                handshaking: 0,
            },
        )]);
        assert!(matches!(decide(&held, ip(1), LIMITS), Decision::Refuse(_)));
        assert_eq!(decide(&held, ip(2), LIMITS), Decision::Take);
        let handshaking = HashMap::from([(
            ip(1),
            Held {
                connections: 2,
                handshaking: 2,
            },
        )]);
        assert!(matches!(
            decide(&handshaking, ip(1), LIMITS),
            Decision::Refuse("too many TLS handshakes in flight from this address")
        ));
    }

    #[test]
    fn a_full_table_makes_room_from_the_biggest_holder_only_for_a_smaller_one() {
        let full = HashMap::from([
            (
                ip(1),
                Held {
                    connections: 4,
                    handshaking: 0,
                },
            ),
            (
                ip(2),
                Held {
                    connections: 3,
                    handshaking: 0,
                },
            ),
            (
                ip(3),
                Held {
                    connections: 1,
                    handshaking: 0,
                },
            ),
        ]);
        // A newcomer (the API server) takes the biggest holder's oldest slot.
        assert_eq!(decide(&full, ip(9), LIMITS), Decision::TakeEvicting(ip(1)));
        assert_eq!(decide(&full, ip(3), LIMITS), Decision::TakeEvicting(ip(1)));
        // Holders of about as many as the biggest wait: no one is pushed out for a peer.
        assert!(matches!(decide(&full, ip(2), LIMITS), Decision::Refuse(_)));
    }

    #[test]
    fn attackers_filling_every_slot_give_way_to_a_newcomer_and_slots_come_back() {
        let connections = Connections::new(LIMITS);
        // Two attackers fill the table with connections that never finish a handshake…
        let mut slots = Vec::new();
        for attacker in [1, 2] {
            for _ in 0..2 {
                slots.push(connections.take(ip(attacker)).unwrap());
            }
            assert!(
                connections.take(ip(attacker)).is_err(),
                "handshakes limited"
            );
            for slot in &slots[slots.len() - 2..] {
                slot.handshaken();
            }
            for _ in 0..2 {
                slots.push(connections.take(ip(attacker)).unwrap());
            }
            assert!(connections.take(ip(attacker)).is_err(), "address limited");
        }
        // …the API server still gets one: the oldest handshaking slot of the biggest
        // holder is evicted, and that connection's task is told.
        let api_server = connections.take(ip(9)).unwrap();
        let evicted: Vec<&Slot> = slots.iter().filter(|s| s.evicted.is_cancelled()).collect();
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].address, ip(1));
        assert_eq!(connections.held(ip(1)).connections, 3);
        api_server.handshaken();
        assert_eq!(
            connections.held(ip(9)),
            Held {
                connections: 1,
                handshaking: 0
            }
        );
        // Dropping every slot (the evicted one too) leaves the table empty.
        drop(slots);
        drop(api_server);
        assert_eq!(connections.held(ip(1)), Held::default());
        assert!(lock(&connections.table).open.is_empty());
    }
}
