//! RAUC's D-Bus API (`de.pengutronix.rauc.Installer` on the system bus, object `/`; signatures
//! from RAUC's `de.pengutronix.rauc.Installer.xml`): the subset the supervisor uses.

use std::collections::HashMap;

use zbus::zvariant::{OwnedValue, Value};

#[zbus::proxy(
    interface = "de.pengutronix.rauc.Installer",
    default_service = "de.pengutronix.rauc",
    default_path = "/"
)]
trait Installer {
    /// `InstallBundle(s source, a{sv} args)`: returns at once; `Completed` tells the end.
    fn install_bundle(&self, source: &str, args: HashMap<&str, Value<'_>>) -> zbus::Result<()>;

    /// `Info(s bundle) -> (s compatible, s version)`, after checking the bundle's signature.
    fn info(&self, bundle: &str) -> zbus::Result<(String, String)>;

    /// `GetSlotStatus() -> a(sa{sv})`.
    fn get_slot_status(&self) -> zbus::Result<Vec<(String, HashMap<String, OwnedValue>)>>;

    /// `Completed(i result)`: 0 on success.
    #[zbus(signal)]
    fn completed(&self, result: i32) -> zbus::Result<()>;

    /// `(percentage, message, nesting depth)`.
    #[zbus(property)]
    fn progress(&self) -> zbus::Result<(i32, String, i32)>;

    /// The last install's error message.
    #[zbus(property)]
    fn last_error(&self) -> zbus::Result<String>;

    /// The compatible string of this system (`system.conf`).
    #[zbus(property)]
    fn compatible(&self) -> zbus::Result<String>;
}

/// A connection to RAUC.
pub struct Rauc {
    installer: InstallerProxy<'static>,
}

fn dbus(what: &str, e: zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(_, Some(message), _) => format!("RAUC refused {what}: {message}"),
        other => format!("RAUC over D-Bus, {what}: {other}"),
    }
}

impl Rauc {
    /// Connects to RAUC on the system bus (`DBUS_SYSTEM_BUS_ADDRESS` is honoured).
    pub async fn connect() -> Result<Rauc, String> {
        let connection = zbus::Connection::system()
            .await
            .map_err(|e| format!("cannot reach the system bus for RAUC: {e}"))?;
        let installer = InstallerProxy::new(&connection)
            .await
            .map_err(|e| dbus("connecting", e))?;
        Ok(Rauc { installer })
    }

    /// The bundle's compatible string and version, once RAUC has checked its signature.
    pub async fn info(&self, bundle: &str) -> Result<(String, String), String> {
        self.installer.info(bundle).await.map_err(|e| {
            // RAUC before 1.10 answers every refusal here with only "rauc info error".
            let why = dbus("the bundle", e);
            format!(
                "{why} (not a bundle, or not signed by the key this image trusts; \
                 `rauc info --keyring /etc/rauc/keyring.pem {bundle}` on the box says which)"
            )
        })
    }

    /// This system's compatible string.
    pub async fn compatible(&self) -> Result<String, String> {
        self.installer
            .compatible()
            .await
            .map_err(|e| dbus("its compatible", e))
    }

    /// Installs `bundle` into the other slot, calling `progress` with RAUC's progress lines.
    pub async fn install(
        &self,
        bundle: &str,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<(), String> {
        use futures_util::StreamExt;
        let mut completed = self
            .installer
            .receive_completed()
            .await
            .map_err(|e| dbus("watching the install", e))?;
        self.installer
            .install_bundle(bundle, HashMap::new())
            .await
            .map_err(|e| dbus("the install", e))?;
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        let mut last = String::new();
        let result = loop {
            tokio::select! {
                signal = completed.next() => {
                    let signal = signal.ok_or("RAUC went away during the install")?;
                    let args = signal.args().map_err(|e| format!("RAUC's Completed signal: {e}"))?;
                    break args.result;
                }
                _ = tick.tick() => {
                    if let Ok((percent, message, _)) = self.installer.progress().await {
                        let line = format!("{percent:3}% {message}");
                        if line != last {
                            progress(&line);
                            last = line;
                        }
                    }
                }
            }
        };
        if result == 0 {
            return Ok(());
        }
        let why = self
            .installer
            .last_error()
            .await
            .unwrap_or_else(|e| format!("(its error could not be read: {e})"));
        Err(format!("RAUC could not install the bundle: {why}"))
    }

    /// RAUC's view of the slots: boot name → (state, bundle version).
    pub async fn slots(&self) -> Result<Vec<(String, HashMap<String, String>)>, String> {
        let slots = self
            .installer
            .get_slot_status()
            .await
            .map_err(|e| dbus("the slot status", e))?;
        Ok(slots
            .into_iter()
            .map(|(name, fields)| {
                let text = fields
                    .into_iter()
                    .filter_map(|(k, v)| String::try_from(v).ok().map(|v| (k, v)))
                    .collect();
                (name, text)
            })
            .collect())
    }
}
