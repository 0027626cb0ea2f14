//! In a cluster, the cluster's own objects are the truth: the Nodes' labels decide where
//! jobs run ([`nodes`]), the Pods say where a ContainerRecreateRequest's pod is and what
//! it runs ([`pods`]); what happens is told as Kubernetes Events ([`events`]). Each
//! reads the API server through kube's client (the watches through [`watched`]); the
//! engines see only what they need (labels, [`crate::recreate_requests::PodFacts`]).

pub mod events;
pub mod nodes;
pub mod pods;
pub mod watched;
