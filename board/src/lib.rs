//! `board`: the only code that touches the machine. Sysfs, procfs, the device tree, the cgroup
//! filesystem and the boot partition, all resolved under one root directory (`/` on a box):
//! every path the supervisor reads or writes ([`paths`]), the readers of what the board is and
//! does ([`facts`]), the bootloader's state ([`eeprom`]) and formats ([`bootloader`]), and the
//! card's A/B slot layout ([`slot`]).
//!
//! The crate depends on nothing of the supervisor's; the supervisor's layers sit on top of it.
//!
//! A board is a live system unless it was opened with a [`Simulation`]: an ordinary directory
//! tree marked by [`SIM_MARKER`], whose kernel and firmware another crate (`board-sim`, used only
//! by tests and local runs) plays. Plain files cannot reproduce what the kernel does on some
//! writes (enabling a cgroup controller, creating a cgroup, turning swap off), so for those few
//! operations [`Board`] asks the simulation to play the kernel's part; everything else is the
//! same code on both. [`Board::open`] refuses a marked tree, so a build without the simulator
//! never treats a simulated board as the live machine (rebooting the host, say).

pub mod bootloader;
pub mod eeprom;
pub mod facts;
pub mod paths;
pub mod slot;

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Marker file at the root of a simulated board tree; its contents name the variant.
pub const SIM_MARKER: &str = ".appliance-sim";

/// What stands in for the kernel and the firmware of a simulated board: the operations that are
/// more than storing bytes in files, and the faults a test injects. Paths are real paths under
/// the board root; `root` is that root.
pub trait Simulation: fmt::Debug + Send + Sync {
    /// A write to a kernel attribute, validated and interpreted the way the kernel does it.
    fn kernel_write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// `mkdir` in the cgroup filesystem: the kernel fills in the new group's interface files.
    fn create_cgroup(&self, path: &Path) -> io::Result<()>;
    /// `swapoff` of one active swap device or file.
    fn swap_off(&self, root: &Path, device: &str) -> io::Result<()>;
    /// Called before every write to the board (a test may slow writes down).
    fn before_write(&self, root: &Path);
    /// Called after every durable write (a test may cut the power there).
    fn after_durable_write(&self, root: &Path);
    /// The machine goes down for a reboot.
    fn request_reboot(&self, root: &Path) -> io::Result<()>;
    /// Bits the simulated CPU flips in computed results (0: it computes correctly).
    fn compute_corruption(&self, root: &Path) -> u64;
    /// The simulated clock in Unix seconds, if one is set (else the host's is the board's).
    fn clock(&self, root: &Path) -> Option<u64>;
    /// Sets the simulated clock.
    fn set_clock(&self, root: &Path, unix: u64) -> io::Result<()>;
}

/// A failed read or write of one board file, naming the file as seen on the box.
#[derive(Debug)]
pub struct BoardError {
    /// What was being done ("reading", "writing", ...).
    pub op: &'static str,
    /// The path on the box (without the simulation root).
    pub path: String,
    /// The underlying cause.
    pub source: io::Error,
}

impl fmt::Display for BoardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path, self.source)
    }
}

impl std::error::Error for BoardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Result of a board operation.
pub type BoardResult<T> = Result<T, BoardError>;

/// Handle on a board's filesystem root.
#[derive(Debug, Clone)]
pub struct Board {
    root: PathBuf,
    simulation: Option<Arc<dyn Simulation>>,
}

/// The largest file the supervisor reads from the board: bootloader images are 2 MiB, every
/// other file it reads (attributes, boot files, records) is far smaller.
pub const MAX_FILE_BYTES: u64 = 32 << 20;

impl Board {
    /// Opens the live board rooted at `root`. A simulated tree (one holding [`SIM_MARKER`]) is
    /// refused: only [`Board::simulated`] may open it, with the simulation that plays its kernel.
    pub fn open(root: &Path) -> BoardResult<Board> {
        let board = Board::at(root, None)?;
        if root.join(SIM_MARKER).is_file() {
            return Err(BoardError {
                op: "opening board root",
                path: root.display().to_string(),
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "a simulated board ({SIM_MARKER}), and this build has no simulator (board-sim)"
                    ),
                ),
            });
        }
        Ok(board)
    }

    /// Opens a simulated board rooted at `root`, whose kernel and firmware `simulation` plays.
    pub fn simulated(root: &Path, simulation: Arc<dyn Simulation>) -> BoardResult<Board> {
        Board::at(root, Some(simulation))
    }

    fn at(root: &Path, simulation: Option<Arc<dyn Simulation>>) -> BoardResult<Board> {
        let meta = fs::metadata(root).map_err(|source| BoardError {
            op: "opening board root",
            path: root.display().to_string(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(BoardError {
                op: "opening board root",
                path: root.display().to_string(),
                source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        Ok(Board {
            root: root.to_path_buf(),
            simulation,
        })
    }

    /// The root directory everything is resolved under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this is a simulated board tree rather than a live system (for reports; what
    /// differs in behaviour is asked of the board, e.g. [`Board::runs_systemd`]).
    pub fn is_simulated(&self) -> bool {
        self.simulation.is_some()
    }

    /// Whether the running system's systemd owns this board and can be asked to manage its
    /// cgroups: the live root `/`, booted by systemd (`/run/systemd/system` exists). A tree under
    /// another root, or a simulated one, has no service manager of its own.
    pub fn runs_systemd(&self) -> bool {
        self.simulation.is_none()
            && self.root == Path::new("/")
            && self.path("/run/systemd/system").is_dir()
    }

    /// Resolves a path as written on the box (e.g. `/proc/cmdline`) under the root.
    pub fn path(&self, box_path: &str) -> PathBuf {
        self.root.join(box_path.trim_start_matches('/'))
    }

    fn err(&self, op: &'static str, box_path: &str, source: io::Error) -> BoardError {
        BoardError {
            op,
            path: box_path.to_string(),
            source,
        }
    }

    /// Whether the path exists (following symlinks).
    pub fn exists(&self, box_path: &str) -> bool {
        self.path(box_path).exists()
    }

    /// Reads a text file; kernel attributes usually end in a newline, which is kept.
    pub fn read(&self, box_path: &str) -> BoardResult<String> {
        let bytes = self.read_bytes(box_path)?;
        String::from_utf8(bytes).map_err(|_| {
            self.err(
                "reading",
                box_path,
                io::Error::new(io::ErrorKind::InvalidData, "not valid UTF-8"),
            )
        })
    }

    /// Reads a file and trims surrounding whitespace and NUL padding (device-tree strings, sysfs values).
    pub fn read_value(&self, box_path: &str) -> BoardResult<String> {
        Ok(self
            .read(box_path)?
            .trim_matches(|c: char| c.is_whitespace() || c == '\0')
            .to_string())
    }

    /// Reads a regular file's raw bytes (at most [`MAX_FILE_BYTES`]): a FIFO, device or
    /// directory someone left where a file belongs, or a file grown huge, is an error rather
    /// than a hang or an out-of-memory abort of the daemon.
    pub fn read_bytes(&self, box_path: &str) -> BoardResult<Vec<u8>> {
        durable::read_bounded(&self.path(box_path), MAX_FILE_BYTES, durable::Links::Follow)
            .map_err(|e| self.err("reading", box_path, e))
    }

    /// Reads a file if it exists; `Ok(None)` when it does not.
    pub fn read_optional(&self, box_path: &str) -> BoardResult<Option<String>> {
        match self.read(box_path) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Names in a directory, sorted; an absent directory lists as empty.
    pub fn list(&self, box_path: &str) -> BoardResult<Vec<String>> {
        let entries = match fs::read_dir(self.path(box_path)) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.err("listing", box_path, e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.err("listing", box_path, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// Canonical path of a box path, expressed as a box path again (for comparing symlink targets).
    pub fn canonical(&self, box_path: &str) -> BoardResult<String> {
        let real = fs::canonicalize(self.path(box_path))
            .map_err(|e| self.err("resolving", box_path, e))?;
        let root = fs::canonicalize(&self.root).map_err(|e| self.err("resolving", "/", e))?;
        let rel = real.strip_prefix(&root).map_err(|_| {
            self.err(
                "resolving",
                box_path,
                io::Error::new(io::ErrorKind::InvalidData, "points outside the board root"),
            )
        })?;
        Ok(format!("/{}", rel.display()))
    }

    /// Writes one value to a kernel attribute (sysfs, cgroupfs) the way `echo value > file` does.
    ///
    /// Kernel attributes without any write bit refuse writes even from root; a simulated tree's
    /// read-only files are given the same meaning, so a root-run test still sees the refusal.
    pub fn write_attribute(&self, box_path: &str, value: &str) -> BoardResult<()> {
        let path = self.path(box_path);
        let meta = fs::metadata(&path).map_err(|e| self.err("writing", box_path, e))?;
        if meta.permissions().mode() & 0o222 == 0 {
            return Err(self.err(
                "writing",
                box_path,
                io::Error::new(io::ErrorKind::PermissionDenied, "read-only attribute"),
            ));
        }
        if let Some(sim) = &self.simulation {
            sim.before_write(&self.root);
            return sim
                .kernel_write(&path, value)
                .map_err(|e| self.err("writing", box_path, e));
        }
        fs::write(&path, value).map_err(|e| self.err("writing", box_path, e))
    }

    /// Replaces a regular file (boot files, state, config) atomically.
    pub fn replace_file(&self, box_path: &str, contents: &[u8]) -> BoardResult<()> {
        let path = self.path(box_path);
        if fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o222 == 0) {
            return Err(self.err(
                "replacing",
                box_path,
                io::Error::new(io::ErrorKind::PermissionDenied, "file is read-only"),
            ));
        }
        self.writing();
        durable::replace(&path, contents).map_err(|e| self.err("replacing", box_path, e))?;
        self.wrote();
        Ok(())
    }

    /// Writes each `(offset, bytes)` of `edits` over `box_path` where those bytes lie (the same
    /// blocks: on FAT, the same clusters), then syncs. For secrets that must not stay readable
    /// on the medium once the file is replaced: a rename leaves the old clusters as they were.
    /// Not atomic: a crash leaves some edits made, so each must keep the file valid alone.
    pub fn overwrite_in_place(
        &self,
        box_path: &str,
        edits: &[(usize, Vec<u8>)],
    ) -> BoardResult<()> {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = fs::OpenOptions::new()
            .write(true)
            .open(self.path(box_path))
            .map_err(|e| self.err("opening", box_path, e))?;
        self.writing();
        for (offset, bytes) in edits {
            file.seek(SeekFrom::Start(*offset as u64))
                .and_then(|_| file.write_all(bytes))
                .map_err(|e| self.err("overwriting", box_path, e))?;
        }
        file.sync_all()
            .map_err(|e| self.err("syncing", box_path, e))?;
        self.wrote();
        Ok(())
    }

    /// Replaces `box_path` atomically with a copy of the regular file `source` (a path on the
    /// running system, e.g. inside a mounted slot), streamed.
    pub fn copy_file_in(&self, source: &Path, box_path: &str) -> BoardResult<()> {
        let mut from = fs::File::open(source)
            .map_err(|e| self.err("opening", &source.display().to_string(), e))?;
        let is_file = from.metadata().map(|m| m.is_file()).unwrap_or(false);
        if !is_file {
            return Err(self.err(
                "copying",
                &source.display().to_string(),
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        self.writing();
        durable::replace_from(&self.path(box_path), &mut from)
            .map_err(|e| self.err("replacing", box_path, e))?;
        self.wrote();
        Ok(())
    }

    /// Mounts the block device `device` read-only at the box path `at` until the returned
    /// guard drops. On a simulated board a slot is a directory: `device` is then a box path
    /// resolved under the root, and nothing is mounted.
    pub fn mount_read_only(&self, device: &str, at: &str) -> BoardResult<Mounted> {
        if self.simulation.is_some() {
            return Ok(Mounted {
                dir: self.path(device),
                mounted: false,
            });
        }
        self.create_dir_all(at)?;
        let status = Command::new("mount")
            .args(["-o", "ro", "--", device, at])
            .status()
            .map_err(|e| self.err("running mount for", device, e))?;
        if !status.success() {
            return Err(self.err(
                "mounting",
                device,
                io::Error::other(format!("mount exited with {status}")),
            ));
        }
        Ok(Mounted {
            dir: self.path(at),
            mounted: true,
        })
    }

    /// Replaces a file only root may read (keys, the Wi-Fi PSK) atomically.
    pub fn replace_private_file(&self, box_path: &str, contents: &[u8]) -> BoardResult<()> {
        let path = self.path(box_path);
        self.writing();
        durable::replace_private(&path, contents)
            .map_err(|e| self.err("replacing", box_path, e))?;
        self.wrote();
        Ok(())
    }

    /// Bytes an unprivileged writer may still store on the filesystem holding `box_path`.
    pub fn free_bytes(&self, box_path: &str) -> BoardResult<u64> {
        let stat = nix::sys::statvfs::statvfs(&self.path(box_path))
            .map_err(|e| self.err("measuring the free space of", box_path, io::Error::from(e)))?;
        Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
    }

    /// Creates `box_path` owner-only with `contents` unless it exists (`Ok(false)` then, the
    /// file untouched): of two creators at once exactly one makes it ([`durable::create_private`]).
    pub fn create_private_file(&self, box_path: &str, contents: &[u8]) -> BoardResult<bool> {
        let path = self.path(box_path);
        self.writing();
        let created = durable::create_private(&path, contents)
            .map_err(|e| self.err("creating", box_path, e))?;
        self.wrote();
        Ok(created)
    }

    /// Points the symbolic link `box_path` at `target` atomically (a new link renamed over the
    /// old one).
    pub fn replace_symlink(&self, box_path: &str, target: &str) -> BoardResult<()> {
        let path = self.path(box_path);
        if fs::read_link(&path).is_ok_and(|t| t == Path::new(target)) {
            return Ok(());
        }
        let tmp = path.with_extension(format!("tmp-link-{}", std::process::id()));
        self.writing();
        let _ = fs::remove_file(&tmp);
        let linked =
            std::os::unix::fs::symlink(target, &tmp).and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = linked {
            let _ = fs::remove_file(&tmp);
            return Err(self.err("linking", box_path, e));
        }
        if let Some(dir) = path.parent() {
            durable::sync_dir(dir).map_err(|e| self.err("linking", box_path, e))?;
        }
        self.wrote();
        Ok(())
    }

    /// Removes a regular file durably (the removal is on disk when this returns); an absent
    /// file is already removed.
    pub fn remove_file(&self, box_path: &str) -> BoardResult<()> {
        let path = self.path(box_path);
        self.writing();
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.err("removing", box_path, e)),
        }
        if let Some(dir) = path.parent() {
            durable::sync_dir(dir).map_err(|e| self.err("removing", box_path, e))?;
        }
        self.wrote();
        Ok(())
    }

    /// A simulated board's writes may be slow (tests inject that).
    fn writing(&self) {
        if let Some(sim) = &self.simulation {
            sim.before_write(&self.root);
        }
    }

    /// A simulated board may lose power after any durable write (tests inject that).
    fn wrote(&self) {
        if let Some(sim) = &self.simulation {
            sim.after_durable_write(&self.root);
        }
    }

    /// Reboots the board; with `tryboot` the firmware boots `tryboot.txt` once. Returns when
    /// the reboot is under way (the caller should do nothing more of consequence).
    pub fn reboot(&self, tryboot: bool) -> BoardResult<()> {
        if tryboot {
            self.create_dir_all("/run/systemd")?;
            self.replace_file(paths::REBOOT_PARAM, b"0 tryboot")?;
        } else {
            self.remove_file(paths::REBOOT_PARAM)?;
        }
        if let Some(sim) = &self.simulation {
            return sim
                .request_reboot(&self.root)
                .map_err(|e| self.err("rebooting", "/", e));
        }
        // systemctl hands PID 1 the reboot job; systemd-shutdown passes reboot-param on.
        let status = Command::new("systemctl")
            .arg("reboot")
            .status()
            .map_err(|e| self.err("running systemctl reboot for", "/", e))?;
        if status.success() {
            Ok(())
        } else {
            Err(self.err(
                "rebooting",
                "/",
                io::Error::other(format!("systemctl reboot exited with {status}")),
            ))
        }
    }

    /// Bits a simulated CPU flips in computed results (always 0 on a real board, whose faults
    /// are real): lets tests show that a wrong computation fails a stability check.
    pub fn compute_corruption(&self) -> u64 {
        self.simulation
            .as_ref()
            .map_or(0, |sim| sim.compute_corruption(&self.root))
    }

    /// Takes an exclusive advisory lock on a file (created if absent), held until the returned
    /// guard is dropped; blocks while another process holds it.
    pub fn lock(&self, box_path: &str) -> BoardResult<nix::fcntl::Flock<fs::File>> {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.path(box_path))
            .map_err(|e| self.err("opening lock", box_path, e))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, errno)| self.err("locking", box_path, io::Error::from(errno)))
    }

    /// The board's clock in Unix seconds (a simulated board may keep its own, see
    /// [`Simulation::clock`]).
    pub fn now_unix(&self) -> u64 {
        if let Some(sim) = &self.simulation
            && let Some(t) = sim.clock(&self.root)
        {
            return t;
        }
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// Sets the board's clock (root only on a live system).
    pub fn set_clock(&self, unix: u64) -> BoardResult<()> {
        if let Some(sim) = &self.simulation {
            return sim
                .set_clock(&self.root, unix)
                .map_err(|e| self.err("setting the clock of", "/", e));
        }
        let seconds = i64::try_from(unix).map_err(|_| {
            self.err(
                "setting the clock of",
                "/",
                io::Error::new(io::ErrorKind::InvalidInput, "time out of range"),
            )
        })?;
        nix::time::clock_settime(
            nix::time::ClockId::CLOCK_REALTIME,
            nix::sys::time::TimeSpec::new(seconds, 0),
        )
        .map_err(|e| self.err("setting the clock of", "/", io::Error::from(e)))
    }

    /// Creates a directory and its missing parents (runtime state under `/run`).
    pub fn create_dir_all(&self, box_path: &str) -> BoardResult<()> {
        fs::create_dir_all(self.path(box_path)).map_err(|e| self.err("creating", box_path, e))
    }

    /// Creates a directory (and its missing parents) that only this user may enter, making an
    /// existing one so too: runtime state under `/run` that other users must not reach.
    pub fn create_private_dir(&self, box_path: &str) -> BoardResult<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path(box_path);
        fs::create_dir_all(&path)
            .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o700)))
            .map_err(|e| self.err("creating", box_path, e))
    }

    /// Creates a cgroup directory (the kernel fills in its interface files).
    pub fn create_cgroup(&self, box_path: &str) -> BoardResult<()> {
        let path = self.path(box_path);
        let result = if let Some(sim) = &self.simulation {
            sim.create_cgroup(&path)
        } else {
            match fs::create_dir(&path) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                other => other,
            }
        };
        result.map_err(|e| self.err("creating cgroup", box_path, e))
    }

    /// Turns off one active swap device or file.
    pub fn swap_off(&self, device: &str) -> BoardResult<()> {
        if let Some(sim) = &self.simulation {
            return sim
                .swap_off(&self.root, device)
                .map_err(|e| self.err("turning off swap on", device, e));
        }
        // util-linux's swapoff; the device comes from /proc/swaps and is passed as one argument.
        let status = Command::new("swapoff")
            .arg(device)
            .status()
            .map_err(|e| self.err("running swapoff for", device, e))?;
        if status.success() {
            Ok(())
        } else {
            Err(self.err(
                "turning off swap on",
                device,
                io::Error::other(format!("swapoff exited with {status}")),
            ))
        }
    }
}

/// A slot mounted read-only by [`Board::mount_read_only`]; unmounted when dropped.
pub struct Mounted {
    dir: PathBuf,
    mounted: bool,
}

impl Mounted {
    /// Where its files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("--").arg(&self.dir).status();
        }
    }
}
