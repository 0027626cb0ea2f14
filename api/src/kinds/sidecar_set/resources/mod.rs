//! A sidecar's resources computed from the pod's containers (`resourcesPolicy`, new in
//! Kruise 1.9), as Kruise's webhook computes them when a pod is created: the pod's
//! containers whose names match `targetContainersNameRegex` (native sidecars first, the
//! sets' own sidecars never), their limits and requests summed or the largest taken
//! (`targetContainersMode`), each through its expression (`resourcesExpr`). A limit that
//! some target lacks is unlimited, and the sidecar gets none either; a request a target
//! lacks counts as 0. A pod no container of which matches is refused.

pub mod expr;
mod quantity;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KubeQuantity;
use serde::{Deserialize, Serialize};

use crate::fields::FieldError;
use expr::Value;
pub use quantity::{Format, Quantity};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourcesPolicy {
    /// `sum` or `max` of the targets' resources.
    pub target_containers_mode: TargetContainersMode,
    /// The pod's containers whose names this matches anywhere (anchor it with `^…$`)
    /// [default: `.*`].
    #[serde(default = "every_name")]
    pub target_containers_name_regex: String,
    pub resources_expr: ResourcesExpr,
}

fn every_name() -> String {
    ".*".to_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TargetContainersMode {
    Sum,
    Max,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourcesExpr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceExprs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<ResourceExprs>,
}

/// An expression per resource, in the variable of its name (`cpu*50%`, `memory + 100Mi`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceExprs {
    /// In `cpu`, the targets' CPU (`cpu*50%`, `max(cpu*50%, 50m)`): `+ - * /`,
    /// parentheses, `max`/`min` of two, numbers, percentages, quantities.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cpu: String,
    /// In `memory`, the targets' memory (`memory*20% + 100Mi`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub memory: String,
}

const RESOURCES: [&str; 2] = ["cpu", "memory"];
const MAX_REGEX: usize = 1024;

impl ResourceExprs {
    fn of(&self, resource: &str) -> &str {
        if resource == "cpu" {
            &self.cpu
        } else {
            &self.memory
        }
    }
}

/// One unit (a core, a byte): what an expression is checked with.
fn one() -> Value {
    Value::Quantity(Quantity::from_milli(1000, Format::DecimalSi))
}

impl ResourcesPolicy {
    /// Checked as Kruise's webhook checks it (`at` is the policy's path): each expression
    /// computed once with its variable at one unit — with a quantity, so that one which
    /// could never compute for a pod (`cpu*cpu`, `1/cpu`) is refused here, not pod by pod.
    pub fn validate(&self, at: &str) -> Result<(), FieldError> {
        self.name_regex()
            .map_err(|cause| FieldError::new(format!("{at}.targetContainersNameRegex"), cause))?;
        let exprs = &self.resources_expr;
        if exprs.limits.is_none() && exprs.requests.is_none() {
            return Err(FieldError::new(
                format!("{at}.resourcesExpr"),
                "at least one of limits or requests must be configured",
            ));
        }
        for (kind, exprs) in [("limits", &exprs.limits), ("requests", &exprs.requests)] {
            for resource in RESOURCES {
                let text = exprs.as_ref().map_or("", |e| e.of(resource));
                if text.is_empty() {
                    continue;
                }
                expr::evaluate(text, (resource, one())).map_err(|cause| {
                    FieldError::new(
                        format!("{at}.resourcesExpr.{kind}.{resource}"),
                        format!("invalid expression: {cause}"),
                    )
                })?;
            }
        }
        Ok(())
    }

    fn name_regex(&self) -> Result<regex::Regex, String> {
        let pattern = &self.target_containers_name_regex;
        if pattern.is_empty() {
            return Err("invalid empty regex".to_owned());
        }
        if pattern.len() > MAX_REGEX {
            return Err(format!("longer than {MAX_REGEX} characters"));
        }
        regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| format!("invalid regex pattern: {e}"))
    }

    /// The pod's containers the policy reads: native sidecars (`init`, restartPolicy
    /// Always) then `containers`, by name, leaving out the names of every sidecar being
    /// injected (`sidecars`).
    pub fn targets<'a>(
        &self,
        init: &'a [core::Container],
        containers: &'a [core::Container],
        sidecars: &BTreeSet<String>,
    ) -> Result<Vec<&'a core::Container>, String> {
        let regex = self.name_regex()?;
        let found: Vec<&core::Container> = init
            .iter()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .chain(containers)
            .filter(|c| !sidecars.contains(&c.name) && regex.is_match(&c.name))
            .collect();
        if found.is_empty() {
            return Err(format!(
                "no containers match the regex pattern {:?}",
                self.target_containers_name_regex
            ));
        }
        Ok(found)
    }

    /// The sidecar's resources from `targets`' (see [`ResourcesPolicy::targets`]).
    pub fn resources(
        &self,
        targets: &[&core::Container],
    ) -> Result<core::ResourceRequirements, String> {
        let mut out = core::ResourceRequirements::default();
        for (limits, exprs) in [
            (true, &self.resources_expr.limits),
            (false, &self.resources_expr.requests),
        ] {
            let Some(exprs) = exprs else { continue };
            let mut computed = BTreeMap::new();
            for resource in RESOURCES {
                let text = exprs.of(resource);
                if text.is_empty() {
                    continue;
                }
                let kind = if limits { "limits" } else { "requests" };
                let aggregate = self.aggregate(targets, resource, limits)?;
                let variable = match aggregate {
                    Some(q) => q,
                    // Unlimited: no limit for the sidecar either, whatever the expression.
                    None if limits => continue,
                    None => Quantity::from_milli(0, Format::DecimalSi),
                };
                let value = expr::evaluate(text, (resource, Value::Quantity(variable)))
                    .map_err(|cause| format!("{kind}.{resource} {text:?}: {cause}"))?;
                let quantity = match value {
                    Value::Quantity(q) => q,
                    Value::Number(n) => number_as(n)
                        .map_err(|cause| format!("{kind}.{resource} {text:?}: {cause}"))?,
                };
                computed.insert(resource.to_owned(), KubeQuantity(quantity.to_string()));
            }
            if computed.is_empty() {
                continue;
            }
            if limits {
                out.limits = Some(computed);
            } else {
                out.requests = Some(computed);
            }
        }
        Ok(out)
    }

    /// `resource` of `targets`' limits (or requests), summed or the largest; `None`
    /// when unlimited (a target without the limit) or no target requests any.
    fn aggregate(
        &self,
        targets: &[&core::Container],
        resource: &str,
        limits: bool,
    ) -> Result<Option<Quantity>, String> {
        let mut values = Vec::new();
        for container in targets {
            let resources = container.resources.as_ref();
            let map = if limits {
                resources.and_then(|r| r.limits.as_ref())
            } else {
                resources.and_then(|r| r.requests.as_ref())
            };
            match map.and_then(|m| m.get(resource)) {
                Some(q) => values.push(Quantity::parse(&q.0).map_err(|cause| {
                    let kind = if limits { "limits" } else { "requests" };
                    format!(
                        "container {}: resources.{kind}.{resource}: {cause}",
                        container.name
                    )
                })?),
                None if limits => return Ok(None),
                None => {}
            }
        }
        let Some((first, rest)) = values.split_first() else {
            return Ok(None);
        };
        let total = match self.target_containers_mode {
            TargetContainersMode::Sum => rest.iter().try_fold(*first, |acc, q| {
                let format = if acc.is_zero() { q.format } else { acc.format };
                Quantity::checked(acc.milli + q.milli, format)
                    .map_err(|cause| format!("the targets' {resource}: {cause}"))
            })?,
            TargetContainersMode::Max => rest
                .iter()
                .fold(*first, |acc, q| if q.milli > acc.milli { *q } else { acc }),
        };
        Ok((limits || !total.is_zero()).then_some(total))
    }
}

/// A plain number as a quantity, to the thousandth (Kruise's: `0.5` in a memory field is
/// `500m` bytes, never a `0` that kubelet would read as no limit).
fn number_as(n: f64) -> Result<Quantity, String> {
    Quantity::from_float_milli(n * 1000.0, Format::DecimalSi)
}

#[cfg(test)]
mod tests;
