//! Which SidecarSets the webhook can serve, and why not the others (pure).
//!
//! A set Rigger cannot use is not a set that is gone: it does not decode (a field of a
//! newer Rigger during an upgrade or a rollback, an integer past Rigger's types, a field of
//! Kruise's own CRD) or Rigger refuses it (an empty selector: the API server prunes a
//! typo'd one to `{}`). The pods it matched must not start without their sidecars, so
//! its webhook entry stays as last written (the last good selectors) and every pod that
//! entry sends is refused, naming the set and the cause, until the set is fixed.

use rigger_api::sidecar_set::SidecarSet;

use rigger_store::typed::Listed;

/// One SidecarSet as the webhook sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum SetState {
    Usable(Box<SidecarSet>),
    Unusable { name: String, cause: String },
}

impl SetState {
    pub fn name(&self) -> &str {
        match self {
            Self::Usable(set) => &set.metadata.name,
            Self::Unusable { name, .. } => name,
        }
    }
}

/// The listed SidecarSets in name order, each usable or not with why.
pub fn states(listed: Listed<SidecarSet>) -> Vec<SetState> {
    let mut states: Vec<SetState> = listed
        .decoded
        .into_iter()
        .map(|stored| {
            let set = stored.value;
            match set.validate_served() {
                Ok(()) => SetState::Usable(Box::new(set)),
                Err(error) => SetState::Unusable {
                    name: set.metadata.name,
                    cause: error.to_string(),
                },
            }
        })
        .chain(
            listed
                .undecodable
                .into_iter()
                .map(|(key, detail)| SetState::Unusable {
                    name: key.name,
                    cause: undecodable(&detail),
                }),
        )
        .collect();
    states.sort_by(|a, b| a.name().cmp(b.name()));
    states
}

/// Why a set that does not decode (`detail`: the decoder's words) cannot be used.
pub fn undecodable(detail: &str) -> String {
    format!("it does not decode: {detail}")
}

/// Why a pod the entry of unusable set `name` sent is refused.
pub fn refusal(name: &str, cause: &str) -> String {
    format!(
        "SidecarSet {name} cannot be used by Rigger ({cause}): the pods it selects are refused rather than started without their sidecars until it is fixed"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rigger_store::ObjectKey;
    use rigger_store::typed::Versioned;
    use serde_json::json;

    fn set(name: &str, selector: &serde_json::Value) -> Versioned<SidecarSet> {
        Versioned {
            key: ObjectKey::new("SidecarSet", "", name),
            revision: 1,
            value: serde_json::from_value(json!({
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
                "metadata": {"name": name},
                "spec": {"selector": selector,
                    "containers": [{"name": "proxy", "image": "r.example/p:1"}]}}))
            .unwrap(),
        }
    }

    #[test]
    fn a_set_that_does_not_decode_or_is_refused_is_unusable_with_its_cause() {
        let listed = Listed {
            decoded: vec![
                set("mesh", &json!({"matchLabels": {"app": "web"}})),
                set("typo", &json!({})),
            ],
            undecodable: vec![(
                ObjectKey::new("SidecarSet", "", "logs"),
                "unknown field `newField`".to_owned(),
            )],
        };
        let states = states(listed);
        let names: Vec<_> = states.iter().map(SetState::name).collect();
        assert_eq!(names, ["logs", "mesh", "typo"], "in name order");
        assert!(matches!(&states[0], SetState::Unusable { cause, .. }
            if cause == "it does not decode: unknown field `newField`"));
        assert!(matches!(&states[1], SetState::Usable(_)));
        assert!(
            matches!(&states[2], SetState::Unusable { cause, .. } if cause.contains("selector")),
            "{:?}",
            states[2]
        );
        let said = refusal("logs", "it does not decode: unknown field `newField`");
        assert!(
            said.starts_with("SidecarSet logs cannot be used by Rigger (it does not decode"),
            "{said}"
        );
    }
}
