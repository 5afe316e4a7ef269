//! The engine's cgroup: its slice with the cpu and memory controllers, `cpu.weight`,
//! `memory.max`, `memory.swap.max` and `memory.low`. Values are always read back from the cgroup
//! files, whichever backend wrote them, and `memory.low` is reported as the protection the kernel
//! actually grants: no more than the smallest `memory.low` on the way up.

use std::collections::BTreeMap;

use super::cmdline::enables_memory;
use super::{Backend, Edit, Plan, Step, Verdict};
use crate::board::{Board, BoardError, paths};
use crate::config::EngineCgroup;
use crate::systemd::PropertyValue;

const MIB: u64 = 1024 * 1024;
const VALUE_FILES: [&str; 4] = ["cpu.weight", "memory.max", "memory.swap.max", "memory.low"];

/// The engine's cgroup as configured, shared by the cgroup steps.
pub struct Target {
    config: EngineCgroup,
    backend: Backend,
    /// Box paths from the cgroup root's child down to the engine's slice.
    levels: Vec<String>,
}

impl Target {
    /// The target for a configuration and backend.
    pub fn new(config: &EngineCgroup, backend: Backend) -> Target {
        let mut levels = Vec::new();
        let mut path = paths::CGROUP_ROOT.to_string();
        for part in config.slice.cgroup_path().split('/') {
            path = format!("{path}/{part}");
            levels.push(path.clone());
        }
        Target {
            config: config.clone(),
            backend,
            levels,
        }
    }

    fn engine_path(&self) -> &str {
        self.levels
            .last()
            .map(String::as_str)
            .unwrap_or(paths::CGROUP_ROOT)
    }

    fn unit_of(level: &str) -> &str {
        level.rsplit('/').next().unwrap_or(level)
    }

    fn observe(&self, board: &Board) -> Result<View, BoardError> {
        let words =
            |text: String| -> Vec<String> { text.split_whitespace().map(str::to_string).collect() };
        let root = paths::CGROUP_ROOT;
        let mut levels = Vec::new();
        for path in &self.levels {
            let exists = board.path(path).is_dir();
            let mut files = BTreeMap::new();
            let (mut controllers, mut subtree) = (Vec::new(), Vec::new());
            if exists {
                controllers = words(board.read(&format!("{path}/cgroup.controllers"))?);
                subtree = words(board.read(&format!("{path}/cgroup.subtree_control"))?);
                for name in VALUE_FILES {
                    if let Some(value) = board.read_optional(&format!("{path}/{name}"))? {
                        files.insert(name, value.trim().to_string());
                    }
                }
            }
            levels.push(Level {
                path: path.clone(),
                exists,
                controllers,
                subtree_control: subtree,
                files,
            });
        }
        // Only the memory steps need these; their failure must not fail the cpu steps.
        let mem_total_kib = board.meminfo_kib("MemTotal").map_err(|e| e.to_string());
        let cmdline_enables_memory = crate::board::slot::cmdline_txt(board)
            .and_then(|path| board.read(&path))
            .map(|text| enables_memory(&text))
            .map_err(|e| e.to_string());
        Ok(View {
            root_controllers: words(board.read(&format!("{root}/cgroup.controllers"))?),
            root_subtree_control: words(board.read(&format!("{root}/cgroup.subtree_control"))?),
            levels,
            mem_total_kib,
            cmdline_enables_memory,
        })
    }

    fn engine<'v>(&self, view: &'v View) -> Option<&'v Level> {
        view.levels.last().filter(|l| l.exists)
    }

    /// The edit that sets one value on one level of our path through the active backend.
    fn set_value(&self, level: &str, file: &str, value: u64, property: &str) -> Edit {
        match self.backend {
            Backend::Files => Edit::WriteAttribute {
                path: format!("{level}/{file}"),
                value: value.to_string(),
            },
            Backend::Systemd => Edit::SetUnitProperties {
                unit: Target::unit_of(level).to_string(),
                properties: vec![(property.to_string(), PropertyValue::U64(value))],
            },
        }
    }

    /// Plan for a memory setting when the kernel may lack the memory controller.
    fn without_memory_controller(&self, view: &View, desired: String) -> Option<Plan> {
        if view.root_controllers.iter().any(|c| c == "memory") {
            return None;
        }
        let verdict = match &view.cmdline_enables_memory {
            Ok(true) => Verdict::PendingReboot(
                "the memory controller appears after a reboot (cgroup_enable=memory is in cmdline.txt)".into(),
            ),
            Ok(false) => Verdict::NotApplicable("the kernel has no memory controller; see kernel.memory_cgroup".into()),
            Err(e) => Verdict::Failed(format!("the kernel has no memory controller, and {e}")),
        };
        Some(Plan {
            desired,
            effective: "no memory controller".into(),
            verdict,
        })
    }

    /// Plan for one numeric file, on the engine's cgroup alone or on every level of its path.
    fn plan_value(&self, view: &View, setting: Setting, want: u64) -> Plan {
        let levels: Vec<&Level> = match setting.scope {
            Scope::Engine => view.levels.last().into_iter().collect(),
            Scope::Path => view.levels.iter().collect(),
        };
        let read = |l: &Level| l.files.get(setting.file).map(|v| parse_limit(v));
        let effective = if self.engine(view).is_none() {
            "cgroup absent".to_string()
        } else {
            let values: Vec<Option<Option<u64>>> = levels.iter().map(|l| read(l)).collect();
            let show = |v: &Option<Option<u64>>| match v {
                None => format!("{} missing", setting.file),
                Some(None) => "unreadable".to_string(),
                Some(Some(n)) => (setting.shown)(*n),
            };
            if values.windows(2).all(|w| w[0] == w[1]) {
                values.first().map(show).unwrap_or_default()
            } else {
                let parts: Vec<String> = levels
                    .iter()
                    .zip(&values)
                    .map(|(l, v)| format!("{} = {}", Target::unit_of(&l.path), show(v)))
                    .collect();
                let least = values
                    .iter()
                    .map(|v| v.flatten().unwrap_or(0))
                    .min()
                    .unwrap_or(0);
                format!("{} ({})", (setting.shown)(least), parts.join(", "))
            }
        };
        let edits: Vec<Edit> = levels
            .iter()
            .filter(|l| !l.exists || read(l) != Some(Some(want)))
            .map(|l| self.set_value(&l.path, setting.file, want, setting.property))
            .collect();
        Plan {
            desired: (setting.shown)(want),
            effective,
            verdict: if edits.is_empty() {
                Verdict::InPlace
            } else {
                Verdict::Change(edits)
            },
        }
    }
}

/// Where a value must be set.
#[derive(Clone, Copy)]
enum Scope {
    /// On the engine's own cgroup.
    Engine,
    /// On every level of the path: siblings compete at each level, so a weight or a protection
    /// counts only as far as every ancestor carries it too.
    Path,
}

/// A numeric cgroup file and its systemd property.
#[derive(Clone, Copy)]
struct Setting {
    file: &'static str,
    property: &'static str,
    scope: Scope,
    shown: fn(u64) -> String,
}

/// The cgroup tree along the engine's path, as read back.
pub struct View {
    root_controllers: Vec<String>,
    root_subtree_control: Vec<String>,
    levels: Vec<Level>,
    mem_total_kib: Result<u64, String>,
    cmdline_enables_memory: Result<bool, String>,
}

struct Level {
    path: String,
    exists: bool,
    controllers: Vec<String>,
    subtree_control: Vec<String>,
    files: BTreeMap<&'static str, String>,
}

/// `max` or a byte count; `None` when it is neither.
fn parse_limit(text: &str) -> Option<u64> {
    if text == "max" {
        Some(u64::MAX)
    } else {
        text.parse().ok()
    }
}

fn show_mib(bytes: u64) -> String {
    if bytes == u64::MAX {
        "max (unlimited)".into()
    } else if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

fn show_plain(n: u64) -> String {
    if n == u64::MAX {
        "max".into()
    } else {
        n.to_string()
    }
}

macro_rules! cgroup_step {
    ($step:ident, $name:literal) => {
        /// A step on the engine's cgroup.
        pub struct $step(pub Target);

        impl Step for $step {
            type Observed = View;

            fn name(&self) -> &'static str {
                $name
            }

            fn observe(&self, board: &Board) -> Result<View, BoardError> {
                self.0.observe(board)
            }

            fn plan(&self, view: &View) -> Plan {
                self.plan_view(view)
            }
        }
    };
}

cgroup_step!(SliceStep, "cgroup.slice");
cgroup_step!(CpuWeightStep, "cgroup.cpu_weight");
cgroup_step!(MemoryMaxStep, "cgroup.memory_max");
cgroup_step!(SwapMaxStep, "cgroup.memory_swap_max");
cgroup_step!(MemoryLowStep, "cgroup.memory_low");

impl SliceStep {
    fn plan_view(&self, view: &View) -> Plan {
        let t = &self.0;
        let mut wanted = vec!["cpu".to_string()];
        if view.root_controllers.iter().any(|c| c == "memory") {
            wanted.push("memory".into());
        }
        let desired = format!("{} with {}", t.engine_path(), wanted.join(" "));
        let missing = |have: &[String]| -> Vec<String> {
            wanted
                .iter()
                .filter(|c| !have.contains(c))
                .cloned()
                .collect()
        };
        let effective = match t.engine(view) {
            None => "absent".to_string(),
            Some(level) if missing(&level.controllers).is_empty() => {
                format!("present with {}", wanted.join(" "))
            }
            Some(level) => format!("present with {}", level.controllers.join(" ")),
        };
        if !view.root_controllers.iter().any(|c| c == "cpu") {
            return Plan {
                desired,
                effective,
                verdict: Verdict::Failed("the kernel offers no cpu controller".into()),
            };
        }
        let ready = t
            .engine(view)
            .is_some_and(|l| missing(&l.controllers).is_empty());
        let verdict = if ready {
            Verdict::InPlace
        } else {
            Verdict::Change(match t.backend {
                Backend::Files => self.file_edits(view, &missing),
                Backend::Systemd => {
                    let mut properties =
                        vec![("CPUAccounting".to_string(), PropertyValue::Bool(true))];
                    if wanted.iter().any(|c| c == "memory") {
                        properties
                            .push(("MemoryAccounting".to_string(), PropertyValue::Bool(true)));
                    }
                    let unit = t.config.slice.as_str().to_string();
                    vec![
                        Edit::StartUnit { unit: unit.clone() },
                        Edit::SetUnitProperties { unit, properties },
                    ]
                }
            })
        };
        Plan {
            desired,
            effective,
            verdict,
        }
    }

    /// Enable the controllers in each parent's `subtree_control` and create each missing level.
    fn file_edits(&self, view: &View, missing: &dyn Fn(&[String]) -> Vec<String>) -> Vec<Edit> {
        let mut edits = Vec::new();
        let mut parent_path = paths::CGROUP_ROOT.to_string();
        let mut parent_subtree = view.root_subtree_control.clone();
        for level in &view.levels {
            let absent = missing(&parent_subtree);
            if !absent.is_empty() {
                let request: Vec<String> = absent.iter().map(|c| format!("+{c}")).collect();
                edits.push(Edit::WriteAttribute {
                    path: format!("{parent_path}/cgroup.subtree_control"),
                    value: request.join(" "),
                });
            }
            if !level.exists {
                edits.push(Edit::CreateCgroup {
                    path: level.path.clone(),
                });
            }
            parent_path = level.path.clone();
            parent_subtree = level.subtree_control.clone();
        }
        edits
    }
}

impl CpuWeightStep {
    fn plan_view(&self, view: &View) -> Plan {
        let setting = Setting {
            file: "cpu.weight",
            property: "CPUWeight",
            scope: Scope::Path,
            shown: show_plain,
        };
        self.0
            .plan_value(view, setting, u64::from(self.0.config.cpu_weight.get()))
    }
}

impl MemoryMaxStep {
    fn plan_view(&self, view: &View) -> Plan {
        let t = &self.0;
        let total_mib = match &view.mem_total_kib {
            Ok(kib) => kib / 1024,
            Err(e) => {
                return Plan {
                    desired: "RAM minus the reserve".into(),
                    effective: "unknown".into(),
                    verdict: Verdict::Failed(e.clone()),
                };
            }
        };
        let want_mib = match t.config.memory_max_mib.map(|m| m.get()) {
            Some(mib) if mib <= total_mib => mib,
            Some(mib) => {
                return Plan {
                    desired: show_mib(mib.saturating_mul(MIB)),
                    effective: "?".into(),
                    verdict: Verdict::Failed(format!(
                        "memory_max_mib = {mib} is more than the board's {total_mib} MiB of RAM"
                    )),
                };
            }
            None if t.config.memory_reserve_mib.get() < total_mib => {
                total_mib - t.config.memory_reserve_mib.get()
            }
            None => {
                return Plan {
                    desired: "RAM minus the reserve".into(),
                    effective: "?".into(),
                    verdict: Verdict::Failed(format!(
                        "memory_reserve_mib = {} leaves nothing of the board's {total_mib} MiB; \
                         lower it or set memory_max_mib",
                        t.config.memory_reserve_mib.get()
                    )),
                };
            }
        };
        let want = want_mib * MIB;
        if let Some(plan) = t.without_memory_controller(view, show_mib(want)) {
            return plan;
        }
        let setting = Setting {
            file: "memory.max",
            property: "MemoryMax",
            scope: Scope::Engine,
            shown: show_mib,
        };
        t.plan_value(view, setting, want)
    }
}

impl SwapMaxStep {
    fn plan_view(&self, view: &View) -> Plan {
        let t = &self.0;
        if let Some(plan) = t.without_memory_controller(view, show_mib(0)) {
            return plan;
        }
        let setting = Setting {
            file: "memory.swap.max",
            property: "MemorySwapMax",
            scope: Scope::Engine,
            shown: show_mib,
        };
        t.plan_value(view, setting, 0)
    }
}

impl MemoryLowStep {
    fn plan_view(&self, view: &View) -> Plan {
        let t = &self.0;
        // Unset means no protection: a value left from an earlier configuration is cleared.
        let want = t
            .config
            .memory_low_mib
            .map_or(0, |m| m.get())
            .saturating_mul(MIB);
        if let Some(plan) = t.without_memory_controller(view, show_mib(want)) {
            return plan;
        }
        let setting = Setting {
            file: "memory.low",
            property: "MemoryLow",
            scope: Scope::Path,
            shown: show_mib,
        };
        let mut plan = t.plan_value(view, setting, want);
        plan.desired = format!("{} effective", plan.desired);
        plan
    }
}
