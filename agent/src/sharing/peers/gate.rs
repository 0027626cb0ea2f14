//! Who gets to talk to an endpoint that other machines reach (the peer endpoint; the
//! mirror, on loopback): a connection is outside input until its TLS handshake proves a
//! certificate, so it is bounded in three ways. Handshakes in flight have a cap of their
//! own and a short deadline; one address may hold only a few connections, handshaking
//! or served (an IPv6 address counts by its /64); a serving slot (`max_connections`) is
//! taken only once the handshake is done, and one certificate holds a share of them
//! only. So bare TCP connections — from anywhere, no certificate needed — cannot lock
//! honest peers out of the serving slots, nor can one node, whatever addresses it uses.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// A TLS handshake gets this long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// An endpoint's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once (after their handshake).
    pub max_connections: usize,
    /// Handshakes in flight at once.
    pub handshakes: usize,
    /// Connections one address (an IPv6 /64) holds at once, handshaking or served, and
    /// serving slots one client certificate holds.
    pub per_address: usize,
}

impl Limits {
    /// The peer endpoint's, for `max_connections` serving slots: an address may hold
    /// half of them (at least 2), and handshakes have room for four times the slots.
    pub fn for_peers(max_connections: usize) -> Self {
        let max_connections = max_connections.max(1);
        Self {
            max_connections,
            handshakes: (max_connections * 4).max(16),
            per_address: (max_connections / 2).max(2),
        }
    }
}

#[derive(Debug)]
struct Shared {
    limits: Limits,
    slots: Arc<Semaphore>,
    handshakes: Arc<Semaphore>,
    per_address: Mutex<HashMap<IpAddr, usize>>,
    /// Serving slots held per client certificate (the SHA-256 of its DER).
    per_identity: Mutex<HashMap<[u8; 32], usize>>,
}

/// A connection let in, still handshaking: holds a handshake permit and its address's
/// count until it is served or dropped.
#[derive(Debug)]
pub struct Admitted {
    shared: Arc<Shared>,
    address: IpAddr,
    handshake: Option<OwnedSemaphorePermit>,
}

/// A connection being served: holds its serving slot, its certificate's and its
/// address's counts.
#[derive(Debug)]
pub struct Served {
    admitted: Admitted,
    identity: [u8; 32],
    _slot: OwnedSemaphorePermit,
}

impl Drop for Served {
    fn drop(&mut self) {
        release(&self.admitted.shared.per_identity, &self.identity);
    }
}

/// One of `key`'s connections ended.
fn release<K: std::hash::Hash + Eq>(counts: &Mutex<HashMap<K, usize>>, key: &K) {
    let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(count) = counts.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(key);
        }
    }
}

impl Admitted {
    /// The handshake is done, with the client certificate `leaf` (DER): the connection
    /// takes a serving slot, or `None` when all are taken or that certificate holds its
    /// share (the connection is then closed, and the peer goes to its next source).
    pub fn handshaken(mut self, leaf: &[u8]) -> Option<Served> {
        use sha2::Digest as _;
        self.handshake = None;
        let identity: [u8; 32] = sha2::Sha256::digest(leaf).into();
        let mut counts = self
            .shared
            .per_identity
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(identity).or_insert(0);
        if *count >= self.shared.limits.per_address {
            if *count == 0 {
                counts.remove(&identity);
            }
            return None;
        }
        let slot = self.shared.slots.clone().try_acquire_owned().ok()?;
        *count += 1;
        drop(counts);
        Some(Served {
            admitted: self,
            identity,
            _slot: slot,
        })
    }
}

/// The key an address is counted under: itself, or for IPv6 its /64 (one host has a
/// whole /64 to choose from).
fn address_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !u128::from(u64::MAX),
            )),
        },
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        release(&self.shared.per_address, &self.address);
    }
}

/// Decides which accepted connections go on.
#[derive(Debug, Clone)]
pub struct Gate(Arc<Shared>);

impl Gate {
    pub fn new(limits: Limits) -> Self {
        Self(Arc::new(Shared {
            limits,
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            handshakes: Arc::new(Semaphore::new(limits.handshakes.max(1))),
            per_address: Mutex::default(),
            per_identity: Mutex::default(),
        }))
    }

    /// A connection from `remote` may handshake, or `None`: too many handshakes in
    /// flight, or its address holds its share already.
    pub fn admit(&self, remote: SocketAddr) -> Option<Admitted> {
        let handshake = self.0.handshakes.clone().try_acquire_owned().ok()?;
        let address = address_key(remote.ip());
        let mut counts = self
            .0
            .per_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(address).or_insert(0);
        if *count >= self.0.limits.per_address {
            return None;
        }
        *count += 1;
        drop(counts);
        Some(Admitted {
            shared: self.0.clone(),
            address,
            handshake: Some(handshake),
        })
    }
}

/// Accept `what` connections on `listener` until `stop`, each the gate lets in handled
/// by `handle` in a task of its own (which takes its serving slot after its handshake:
/// [`Admitted::handshaken`]); the others are closed at once.
pub async fn accept<H, F>(
    listener: TcpListener,
    gate: Gate,
    what: &'static str,
    stop: CancellationToken,
    handle: H,
) where
    H: Fn(tokio::net::TcpStream, SocketAddr, Admitted, CancellationToken) -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let (stream, remote) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a {what} connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(admitted) = gate.admit(remote) else {
            tracing::debug!(%remote, "{what} connection refused: too many handshakes, or its address holds its share");
            continue;
        };
        tokio::spawn(handle(stream, remote, admitted, stop.clone()));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn at(ip: [u8; 4]) -> SocketAddr {
        (ip, 1000).into()
    }

    #[test]
    fn handshakes_take_no_serving_slot_and_one_address_takes_its_share_only() {
        let gate = Gate::new(Limits {
            max_connections: 2,
            handshakes: 8,
            per_address: 2,
        });
        // An address holding handshakes open: only its share.
        let bare: Vec<_> = (0..5)
            .filter_map(|_| gate.admit(at([10, 0, 0, 9])))
            .collect();
        assert_eq!(bare.len(), 2);
        // Honest peers still handshake and are served: the slots were never taken.
        let a = gate
            .admit(at([10, 0, 0, 1]))
            .unwrap()
            .handshaken(b"a")
            .unwrap();
        let b = gate
            .admit(at([10, 0, 0, 2]))
            .unwrap()
            .handshaken(b"b")
            .unwrap();
        // Past the slots, a handshaken connection is closed.
        assert!(
            gate.admit(at([10, 0, 0, 3]))
                .unwrap()
                .handshaken(b"c")
                .is_none()
        );
        drop(a);
        assert!(
            gate.admit(at([10, 0, 0, 3]))
                .unwrap()
                .handshaken(b"c")
                .is_some()
        );
        drop((b, bare));
        assert!(gate.0.per_address.lock().unwrap().len() <= 1);
    }

    #[test]
    fn one_certificate_holds_its_share_of_the_slots_whatever_its_addresses() {
        let gate = Gate::new(Limits::for_peers(8));
        // A node with many addresses, one certificate: half the slots.
        let liar: Vec<_> = (0..8u8)
            .filter_map(|i| gate.admit(at([10, 0, 3, i]))?.handshaken(b"liar"))
            .collect();
        assert_eq!(liar.len(), 4);
        // The rest go to the others.
        let honest: Vec<_> = (0..4u8)
            .filter_map(|i| gate.admit(at([10, 0, 4, i]))?.handshaken(&[i]))
            .collect();
        assert_eq!(honest.len(), 4);
        drop((liar, honest));
        assert!(gate.0.per_identity.lock().unwrap().is_empty());
    }

    #[test]
    fn an_ipv6_host_counts_by_its_64() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(address_key(mapped), IpAddr::from([10, 0, 0, 1]));
    }

    #[test]
    fn handshakes_in_flight_are_capped() {
        let gate = Gate::new(Limits {
            max_connections: 8,
            handshakes: 3,
            per_address: 100,
        });
        let mut held: Vec<_> = (0..10u8)
            .filter_map(|i| gate.admit(at([10, 0, 1, i])))
            .collect();
        assert_eq!(held.len(), 3);
        assert!(gate.admit(at([10, 0, 2, 1])).is_none());
        // A finished handshake gives its permit back.
        let served = held.remove(0).handshaken(b"a").unwrap();
        assert!(gate.admit(at([10, 0, 2, 1])).is_some());
        drop((served, held));
    }
}
