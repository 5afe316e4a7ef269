//! Talking to systemd over D-Bus (`org.freedesktop.systemd1`): on a box, systemd owns the cgroup
//! tree, so the engine's limits are set as unit properties on its slice and systemd writes the
//! cgroup files.

use zbus::zvariant::{OwnedObjectPath, Value};

/// The subset of `org.freedesktop.systemd1.Manager` the supervisor uses (signatures from
/// `org.freedesktop.systemd1(5)`).
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Manager {
    /// `StartUnit(s name, s mode) -> o job`.
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    /// `SetUnitProperties(s name, b runtime, a(sv) properties)`.
    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Value<'_>)],
    ) -> zbus::Result<()>;
}

/// A unit property value of one of the D-Bus types the supervisor sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertyValue {
    /// D-Bus `t` (CPUWeight, MemoryMax, ...).
    U64(u64),
    /// D-Bus `b` (CPUAccounting, MemoryAccounting).
    Bool(bool),
}

/// A connection to systemd's manager.
pub struct Systemd {
    manager: ManagerProxy<'static>,
}

impl Systemd {
    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` is honoured), or to `address`.
    pub async fn connect(address: Option<&str>) -> zbus::Result<Systemd> {
        let connection = match address {
            Some(address) => zbus::connection::Builder::address(address)?.build().await?,
            None => zbus::Connection::system().await?,
        };
        let manager = ManagerProxy::new(&connection).await?;
        Ok(Systemd { manager })
    }

    /// Starts a unit (`replace` mode), e.g. the engine's slice so its cgroup exists.
    pub async fn start_unit(&self, unit: &str) -> zbus::Result<()> {
        self.manager.start_unit(unit, "replace").await.map(drop)
    }

    /// Sets properties for this boot only (`runtime = true`): the root filesystem is read-only
    /// and the supervisor applies them again at every start.
    pub async fn set_unit_properties(
        &self,
        unit: &str,
        properties: &[(String, PropertyValue)],
    ) -> zbus::Result<()> {
        let values: Vec<(&str, Value<'_>)> = properties
            .iter()
            .map(|(name, value)| {
                let value = match *value {
                    PropertyValue::U64(n) => Value::U64(n),
                    PropertyValue::Bool(b) => Value::Bool(b),
                };
                (name.as_str(), value)
            })
            .collect();
        self.manager.set_unit_properties(unit, true, &values).await
    }
}
