//! Clusters in a fleet file (`[[cluster]]`): several boxes serving one model too large for any
//! of them. The fleet file names each cluster's head, workers (in the order they hold layers),
//! link network and model; `appliance stamp` gives each member its part (`[box.cluster]`), and
//! the members' WireGuard keys, made on the boxes, are exchanged by `appliance fleet enroll`.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

use crate::values::{Hostname, IpPrefix, ModelId};

/// `[[cluster]]` in a fleet file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterDef {
    /// The cluster's name.
    pub name: Hostname,
    /// The box that serves the API and holds the first layers.
    pub head: Hostname,
    /// The boxes that hold the layers after the head's, in order.
    pub workers: Vec<Hostname>,
    /// The link's network, IPv4 (`10.77.0.0/24`): the head takes its first address, the
    /// workers the next ones in order.
    pub link: IpPrefix,
    /// The model the cluster serves (installed on the head).
    pub model: ModelId,
    /// While a worker is gone the head serves its own model (`own-model`, the default) or
    /// nothing (`none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
}

/// What the head serves while a worker is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// Its own model.
    OwnModel,
    /// Nothing.
    None,
}

/// A member's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The head.
    Head,
    /// A worker.
    Worker,
}

/// `[box.cluster]`: one box's part in its cluster, as `appliance stamp` writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Membership {
    /// The cluster's name.
    pub name: Hostname,
    /// This box's part.
    pub role: Role,
    /// This box's address on the link, with the link's prefix length.
    pub address: IpPrefix,
    /// The head: the model the cluster serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelId>,
    /// The head: what it serves while a worker is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
}

impl ClusterDef {
    /// The members in order: the head, then the workers.
    pub fn members(&self) -> impl Iterator<Item = &Hostname> {
        std::iter::once(&self.head).chain(&self.workers)
    }

    /// The link address of the `index`th member (the head is 0), with the link's prefix.
    pub fn address(&self, index: usize) -> Option<IpPrefix> {
        let IpAddr::V4(network) = self.link.address else {
            return None;
        };
        let host = u32::try_from(index).ok()?.checked_add(1)?;
        let address = u32::from(network).checked_add(host)?;
        Some(IpPrefix {
            address: IpAddr::V4(Ipv4Addr::from(address)),
            prefix: self.link.prefix,
        })
    }

    /// Box `name`'s part, if it is a member.
    pub fn membership(&self, name: &str) -> Option<Membership> {
        let index = self.members().position(|m| m.as_str() == name)?;
        let head = index == 0;
        Some(Membership {
            name: self.name.clone(),
            role: if head { Role::Head } else { Role::Worker },
            address: self.address(index)?,
            model: head.then(|| self.model.clone()),
            fallback: if head { self.fallback } else { None },
        })
    }

    /// What is wrong with it, given the fleet's box names and the members of the clusters
    /// checked before it.
    pub fn check(
        &self,
        boxes: &HashSet<&Hostname>,
        taken: &mut HashSet<Hostname>,
    ) -> Result<(), String> {
        let at = format!("[[cluster]] \"{}\"", self.name);
        if self.workers.is_empty() {
            return Err(format!("{at}: a cluster needs at least one worker"));
        }
        for member in self.members() {
            if !boxes.contains(member) {
                return Err(format!("{at}: \"{member}\" is not a [[box]] of this fleet"));
            }
            if !taken.insert(member.clone()) {
                return Err(format!(
                    "{at}: \"{member}\" is named twice (a box is a member of one cluster, once)"
                ));
            }
        }
        let IpAddr::V4(network) = self.link.address else {
            return Err(format!("{at}: link {} is not IPv4", self.link));
        };
        let prefix = self.link.prefix;
        if !(8..=30).contains(&prefix) {
            return Err(format!(
                "{at}: link prefix /{prefix}: allowed are /8 to /30"
            ));
        }
        let host_bits = 32 - u32::from(prefix);
        if u32::from(network) & ((1u32 << host_bits) - 1) != 0 {
            return Err(format!(
                "{at}: link {} is not a network address (its host part is not zero)",
                self.link
            ));
        }
        let members = self.workers.len() as u64 + 1;
        // The network and broadcast addresses are not hosts.
        if members + 2 > 1u64 << host_bits {
            return Err(format!(
                "{at}: link {} has room for {} members, not {members}",
                self.link,
                (1u64 << host_bits) - 2
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> ClusterDef {
        toml::from_str(
            "name = \"front-desk\"\nhead = \"reception\"\nworkers = [\"office-1\", \"office-2\"]\n\
             link = \"10.77.0.0/24\"\nmodel = \"qwen3-30b\"\n",
        )
        .expect("cluster")
    }

    #[test]
    fn members_take_addresses_in_order_and_only_the_head_the_model() {
        let d = def();
        let head = d.membership("reception").expect("head");
        assert_eq!(
            (head.role, head.address.to_string()),
            (Role::Head, "10.77.0.1/24".into())
        );
        assert_eq!(head.model.as_ref().map(ModelId::as_str), Some("qwen3-30b"));
        let second = d.membership("office-2").expect("worker");
        assert_eq!(second.address.to_string(), "10.77.0.3/24");
        assert_eq!((second.role, second.model), (Role::Worker, None));
        assert_eq!(d.membership("store"), None);
    }
}
