//! Stored objects this controller cannot decode: written by a newer release (a field or
//! a value this one does not know — users' objects are decoded strictly, so that one is
//! never written back without a field it lacks), or around the API. They are left alone, never taken
//! for deleted: a job's pulls go on and its status stays, a request is not cancelled, a
//! node's pods keep running. Each is said once (a Warning event naming the field, and a
//! log line) until it decodes again or goes; a controller that reads it then takes it up.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::events::{Event, EventSink, Regarding};
use rigger_store::ObjectKey;

/// The event's reason.
pub const OBJECT_UNDECODABLE: &str = "ObjectUndecodable";

/// The objects of one kind found undecodable, and what was said of each (an engine's
/// passes share it).
#[derive(Debug, Default)]
pub struct Undecodable {
    said: Mutex<HashMap<ObjectKey, String>>,
}

impl Undecodable {
    /// Take the listing's undecodable objects (`found`: key and why) as the current ones;
    /// each new one, or one with a new cause, is said once through `events`.
    /// `api_version` is the kind's, for the event's object.
    pub fn observe(
        &self,
        api_version: &str,
        found: &[(ObjectKey, String)],
        events: &dyn EventSink,
    ) {
        let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
        let mut now = HashMap::with_capacity(found.len());
        for (key, detail) in found {
            if said.get(key) != Some(detail) {
                tracing::warn!(object = %key, %detail, controller = crate::VERSION, "a stored object does not decode; left alone, as it is");
                events.record(event(api_version, key, detail));
            }
            now.insert(key.clone(), detail.clone());
        }
        for key in said.keys() {
            if !now.contains_key(key) {
                tracing::info!(object = %key, "a stored object that did not decode decodes again, or is gone");
            }
        }
        *said = now;
    }

    /// Whether `key` did not decode at the last listing.
    #[cfg(test)]
    fn contains(&self, key: &ObjectKey) -> bool {
        self.said
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }
}

/// The Warning event for the object `key` that does not decode (`detail` names the field).
pub fn event(api_version: &str, key: &ObjectKey, detail: &str) -> Event {
    Event {
        regarding: Regarding {
            api_version: api_version.to_owned(),
            kind: key.kind.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid: String::new(),
        },
        warning: true,
        reason: OBJECT_UNDECODABLE,
        message: format!(
            "controller {} cannot read this object ({detail}); it is left as it is, its work and status kept, until a controller that reads it runs (was it written by a newer release?)",
            crate::VERSION
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Debug, Default)]
    struct Recorded(Mutex<Vec<Event>>);

    impl EventSink for Recorded {
        fn record(&self, event: Event) {
            if let Ok(mut events) = self.0.lock() {
                events.push(event);
            }
        }
    }

    #[test]
    fn each_undecodable_object_is_said_once_per_cause() {
        let events = Recorded::default();
        let key = ObjectKey::new("ImagePullJob", "default", "new");
        let undecodable = Undecodable::default();
        let found = vec![(key.clone(), "spec.foo: unknown variant `X`".to_owned())];
        undecodable.observe("apps.kruise.io/v1alpha1", &found, &events);
        undecodable.observe("apps.kruise.io/v1alpha1", &found, &events);
        assert!(undecodable.contains(&key));
        let said = events.0.lock().map(|e| e.clone()).unwrap_or_default();
        assert_eq!(said.len(), 1);
        assert_eq!(said[0].reason, OBJECT_UNDECODABLE);
        assert!(said[0].warning);
        assert!(
            said[0].message.contains("spec.foo: unknown variant `X`"),
            "{}",
            said[0].message
        );
        assert_eq!(said[0].regarding.name, "new");

        let other = vec![(key.clone(), "spec.bar: invalid type".to_owned())];
        undecodable.observe("apps.kruise.io/v1alpha1", &other, &events);
        undecodable.observe("apps.kruise.io/v1alpha1", &[], &events);
        assert!(!undecodable.contains(&key));
        assert_eq!(events.0.lock().map(|e| e.len()).unwrap_or_default(), 2);
    }
}
