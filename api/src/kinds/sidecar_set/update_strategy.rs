//! A SidecarSet's `updateStrategy`: how its new versions reach the pods that have it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fields::{FieldError, IntOrPercent, LabelSelector, check_range};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateStrategy {
    /// RollingUpdate [default] moves the pods that have the sidecars to the new version;
    /// NotUpdate leaves them, and only pods created from now on get it (Kruise's).
    #[serde(
        rename = "type",
        default,
        skip_serializing_if = "UpdateStrategyType::is_default"
    )]
    pub kind: UpdateStrategyType,
    /// Pods being upgraded (or not ready) at once [default: 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
    /// Pods left on the old version (int or percent of the matched pods) [default: 0].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<IntOrPercent>,
    #[serde(default)]
    pub paused: bool,
    /// Only these of the matched pods are upgraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_strategy: Option<PriorityStrategy>,
    /// Spread the upgrades over the values of these labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scatter_strategy: Vec<ScatterTerm>,
}

impl UpdateStrategy {
    /// The weights as Kruise bounds them (1 to 100); counts are bounded as they are read.
    pub fn validate(&self) -> Result<(), FieldError> {
        for (i, term) in self
            .priority_strategy
            .iter()
            .flat_map(|p| p.weight_priority.iter())
            .enumerate()
        {
            check_range(
                &format!("spec.updateStrategy.priorityStrategy.weightPriority[{i}].weight"),
                u64::try_from(term.weight).unwrap_or(0),
                1,
                100,
            )?;
        }
        Ok(())
    }
}

/// Kruise's `updateStrategy.type`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum UpdateStrategyType {
    #[default]
    RollingUpdate,
    NotUpdate,
}

impl UpdateStrategyType {
    fn is_default(&self) -> bool {
        *self == Self::RollingUpdate
    }
}

/// Kruise's priority: weights by selector (higher first) or order by a label's value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityStrategy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weight_priority: Vec<WeightTerm>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order_priority: Vec<OrderTerm>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightTerm {
    pub weight: i32,
    pub match_selector: LabelSelector,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrderTerm {
    /// Pods with a higher integer value of this label go first (Kruise's `orderedKey`;
    /// `orderKey`, Rigger's earlier spelling, is still read from stored objects).
    #[serde(alias = "orderKey")]
    pub ordered_key: String,
}

impl OrderTerm {
    /// A pod's order under this term, as Kruise reads it: the integer the label's value
    /// ends with (`sts-10` → 10); 0 without one, or without the label.
    pub fn order_of(&self, labels: &BTreeMap<String, String>) -> i64 {
        let value = labels.get(&self.ordered_key).map_or("", String::as_str);
        let digits = value.len() - value.bytes().rev().take_while(u8::is_ascii_digit).count();
        value[digits..].parse().unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScatterTerm {
    pub key: String,
    pub value: String,
}
