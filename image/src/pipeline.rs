//! The build: host tools → binfmt → build chroot (cached) → cross build → package rootfs
//! (cached) → assembled root, boot and data filesystems → partitioned disk image + `.sha256`.
//! Each cached layer's directory or file name carries a key over exactly what it is made from,
//! and is complete only once renamed into place, so an interrupted build never leaves a
//! half-made layer that a later one would trust.

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::args;
use crate::definition::Definition;
use crate::layout::{self, Role};
use crate::run::{have, run, status, with_input};

/// Where the build reads and writes.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The repository root.
    pub repo: PathBuf,
    /// `out/`: the image, its checksum, the work tree.
    pub out: PathBuf,
    /// Cached layers (`APPLIANCE_IMAGE_CACHE`, else `out/cache`).
    pub cache: PathBuf,
}

impl Paths {
    /// The layout for a repository.
    pub fn for_repo(repo: &Path) -> Paths {
        let out = repo.join("out");
        let cache = std::env::var_os("APPLIANCE_IMAGE_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| out.join("cache"));
        Paths {
            repo: repo.to_path_buf(),
            out,
            cache,
        }
    }

    /// The assembled partition contents of the last build.
    pub fn work(&self) -> PathBuf {
        self.out.join("work")
    }
}

/// What the build is asked for beyond the definition.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Install the default model (fetched through its manifest into this cache) onto the data
    /// partition, as a provisioned box would have it.
    pub model_cache: Option<PathBuf>,
    /// The system version stamped into the root filesystem and the bundle (`None`: the build
    /// time, see [`crate::bundle::version_from_time`]).
    pub version: Option<String>,
    /// The fleet's bundle signing pair (`None`: the checkout's development pair).
    pub signing: Option<crate::bundle::Signing>,
    /// For the rollback test only: the engine binary replaced by one that exits at once.
    pub broken_engine: bool,
}

/// What a build produced.
#[derive(Debug)]
pub struct Built {
    /// The image.
    pub image: PathBuf,
    /// Bytes the image occupies on the host (it is sparse).
    pub allocated: u64,
    /// Its apparent size.
    pub size: u64,
    /// Bytes in the root filesystem tree.
    pub rootfs_bytes: u64,
    /// The signed update bundle of the same build.
    pub bundle: PathBuf,
    /// The system version.
    pub version: String,
}

const HOST_TOOLS: [(&str, &str); 8] = [
    ("mmdebstrap", "mmdebstrap"),
    ("arch-test", "arch-test"),
    ("qemu-aarch64-static", "qemu-user-static"),
    ("mkfs.vfat", "dosfstools"),
    ("mcopy", "mtools"),
    ("mkfs.ext4", "e2fsprogs"),
    ("sfdisk", "fdisk"),
    ("zstd", "zstd"),
];

/// Builds the image for `definition`.
pub fn build(definition: &Definition, paths: &Paths, options: &Options) -> Result<Built, String> {
    let started = Instant::now();
    host_tools(&HOST_TOOLS)?;
    host_tools(&crate::bundle::HOST_TOOLS)?;
    binfmt()?;
    let built_unix = build_time()?;
    let version = match &options.version {
        Some(v) => checked_version(v)?,
        None => crate::bundle::version_from_time(built_unix),
    };
    let signing = crate::bundle::signing(options.signing.clone(), &paths.out)?;
    let mirror = crate::mirror::mirror()?;
    fs::create_dir_all(&paths.cache).map_err(|e| io("creating", &paths.cache, e))?;
    let builder = builder_chroot(definition, paths, &mirror)?;
    let binaries = cross_build(definition, paths, &builder)?;
    let rootfs = package_rootfs(definition, paths, &mirror)?;
    let work = paths.work();
    if work.exists() {
        fs::remove_dir_all(&work).map_err(|e| io("clearing", &work, e))?;
    }
    let root = work.join("root");
    fs::create_dir_all(&root).map_err(|e| io("creating", &root, e))?;
    run("tar", args!["--zstd", "-xpf", rootfs, "-C", root])?;
    customize_root(definition, paths, &root, &binaries, built_unix)?;
    system_identity(definition, &root, &version, &signing, options.broken_engine)?;
    let boot = boot_files(definition, paths, &root, &work.join("boot"))?;
    let data = data_files(paths, &work.join("data"), options)?;
    let image = disk_image(definition, paths, &root, &boot, &data)?;
    let bundle = crate::bundle::make(
        definition,
        &paths.out,
        &work,
        &work.join(format!("{}.fs", Role::RootA.label())),
        &version,
        &signing,
    )?;
    let meta = fs::metadata(&image).map_err(|e| io("reading", &image, e))?;
    use std::os::unix::fs::MetadataExt;
    let built = Built {
        allocated: meta.blocks() * 512,
        size: meta.len(),
        rootfs_bytes: tree_bytes(&root),
        image,
        bundle,
        version,
    };
    eprintln!("image built in {:.0} s", started.elapsed().as_secs_f64());
    Ok(built)
}

/// When the image is built (Unix seconds): `SOURCE_DATE_EPOCH` for reproducible builds, else
/// now.
fn build_time() -> Result<u64, String> {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs())
        })
        .ok_or_else(|| "the build machine's clock is before 1970".to_string())
}

/// A version RAUC and the supervisor can order: digits, letters and `.-+`, starting with a
/// digit.
fn checked_version(v: &str) -> Result<String, String> {
    let ok = v.len() <= 64
        && v.starts_with(|c: char| c.is_ascii_digit())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c));
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "--version {v:?}: use digits and dots (e.g. 2026.12.1 or 3), at most 64 characters"
        ))
    }
}

/// The system's version, RAUC's configuration and keyring, and the files of its boot folder
/// (kernel, initramfs, device trees, version), which RAUC's post-install handler copies onto
/// the boot partition when this system is installed into a slot.
fn system_identity(
    d: &Definition,
    root: &Path,
    version: &str,
    signing: &crate::bundle::Signing,
    broken_engine: bool,
) -> Result<(), String> {
    write(
        &root.join("usr/share/appliance/version"),
        &format!("{version}\n"),
    )?;
    write(
        &root.join("etc/rauc/system.conf"),
        &crate::bundle::system_conf(d),
    )?;
    fs::copy(&signing.cert, root.join("etc/rauc/keyring.pem"))
        .map_err(|e| io("copying", &signing.cert, e))?;
    if broken_engine {
        let engine = root.join("usr/bin/engine");
        write(
            &engine,
            "#!/bin/sh\necho 'this engine is broken on purpose (appliance-image build --test-broken-engine)' >&2\nexit 1\n",
        )?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&engine, fs::Permissions::from_mode(0o755))
            .map_err(|e| io("marking executable", &engine, e))?;
    }
    slot_boot_dir(d, root, version)
}

/// `usr/lib/appliance/boot/`: what the firmware loads for a slot holding this system.
fn slot_boot_dir(d: &Definition, root: &Path, version: &str) -> Result<(), String> {
    let dir = root.join(SLOT_BOOT_DIR);
    fs::create_dir_all(&dir).map_err(|e| io("creating", &dir, e))?;
    let kernel_dir = root.join("boot");
    let newest = |prefix: &str| -> Result<PathBuf, String> {
        let mut found: Vec<PathBuf> = fs::read_dir(&kernel_dir)
            .map_err(|e| io("listing", &kernel_dir, e))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .collect();
        found.sort();
        found.pop().ok_or_else(|| {
            format!("no {prefix}* in the rootfs's /boot: is the kernel package installed?")
        })
    };
    let vmlinuz = newest("vmlinuz-")?;
    let kernel = vmlinuz
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .trim_start_matches("vmlinuz-")
                .to_string()
        })
        .unwrap_or_default();
    fs::copy(&vmlinuz, dir.join("vmlinuz")).map_err(|e| io("copying", &vmlinuz, e))?;
    let initrd = newest("initrd.img-")?;
    fs::copy(&initrd, dir.join("initrd.img")).map_err(|e| io("copying", &initrd, e))?;
    let candidates = [
        root.join("usr/lib/modules")
            .join(&kernel)
            .join("dtb/broadcom"),
        root.join(format!("usr/lib/linux-image-{kernel}/broadcom")),
    ];
    for dtb in &d.rootfs.device_trees {
        let source = candidates
            .iter()
            .map(|dir| dir.join(dtb))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("device tree {dtb} is not in kernel {kernel}"))?;
        fs::copy(&source, dir.join(dtb)).map_err(|e| io("copying", &source, e))?;
    }
    write(&dir.join("version"), &format!("{version}\n"))
}

/// Where a system keeps its boot folder's files (the supervisor's post-install handler reads
/// the same path).
const SLOT_BOOT_DIR: &str = "usr/lib/appliance/boot";

fn io(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

/// Installs missing host tools from the host's apt sources (as root), or says which to install.
pub(crate) fn host_tools(tools: &[(&str, &str)]) -> Result<(), String> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(program, _)| !have(program))
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "missing host tools; install them with: apt-get install --no-install-recommends {}",
            missing.join(" ")
        ));
    }
    run("apt-get", args!["update"])?;
    let mut install = args!["install", "-y", "--no-install-recommends"];
    install.extend(missing.iter().map(OsString::from));
    status(
        Command::new("apt-get")
            .args(install)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn is_root() -> bool {
    // The owner of /proc/self is the effective user.
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Registers qemu-user for arm64 binaries (PID 1 may not be systemd, so nobody else does).
fn binfmt() -> Result<(), String> {
    let misc = Path::new("/proc/sys/fs/binfmt_misc");
    if misc.join("qemu-aarch64").exists() {
        return Ok(());
    }
    if !misc.join("register").exists() {
        run("mount", args!["-t", "binfmt_misc", "binfmt_misc", misc])?;
    }
    let rule = fs::read_to_string("/usr/lib/binfmt.d/qemu-aarch64.conf")
        .map_err(|e| format!("qemu-user-static's binfmt rule: {e}"))?;
    fs::write(misc.join("register"), rule.trim())
        .map_err(|e| format!("registering qemu-aarch64 with binfmt_misc: {e}"))
}

/// A short key over the parts a layer is made from.
fn key(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for p in parts {
        hash.update(p.as_bytes());
        hash.update([0]);
    }
    hash.finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The suites other than the definition's that `package/suite` entries name, each once.
fn extra_suites(packages: &[String]) -> Vec<String> {
    let mut suites: Vec<String> = Vec::new();
    for suite in packages
        .iter()
        .filter_map(|p| p.split_once('/').map(|(_, s)| s))
    {
        if !suites.iter().any(|s| s == suite) {
            suites.push(suite.to_string());
        }
    }
    suites
}

fn sources(suite: &str, mirror: &str, extra: &[String], components: &[String]) -> Vec<OsString> {
    let components = components.join(" ");
    let mut list = args![format!("deb {mirror} {suite} {components}")];
    for other in extra.iter().filter(|s| *s != suite) {
        // A mirror kept offline serves the testing suite with its Release file past its
        // Valid-Until date; its signature is still checked.
        let options = if other.starts_with(&format!("{suite}-")) {
            ""
        } else {
            "[check-valid-until=no] "
        };
        list.push(format!("deb {options}{mirror} {other} {components}").into());
    }
    list
}

/// The build chroot: Debian with rustc, cargo, the arm64 std and the cross linker.
fn builder_chroot(d: &Definition, paths: &Paths, mirror: &str) -> Result<PathBuf, String> {
    let b = &d.builder;
    let mut packages: Vec<String> = b.packages.clone();
    let from = |p: &str| {
        if b.rust_from_backports {
            format!("{p}/{}-backports", b.suite)
        } else {
            p.to_string()
        }
    };
    packages.extend([from("rustc"), from("cargo"), from("libstd-rust-dev:arm64")]);
    let joined = packages.join(",");
    let dir = paths
        .cache
        .join(format!("builder-{}", key(&[&b.suite, &joined, mirror])));
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    let partial = dir.with_extension("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial).map_err(|e| io("clearing", &partial, e))?;
    }
    let mut command = args![
        "--variant=apt",
        "--architectures=amd64,arm64",
        format!("--include={joined}"),
        &b.suite,
        &partial
    ];
    command.extend(sources(
        &b.suite,
        mirror,
        &extra_suites(&packages),
        &["main".to_string()],
    ));
    run("mmdebstrap", command)?;
    fs::write(partial.join(".complete"), "").map_err(|e| io("marking", &partial, e))?;
    fs::rename(&partial, &dir).map_err(|e| io("placing", &dir, e))?;
    Ok(dir)
}

/// Mounts that must be undone whatever happens.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    fn bind(&mut self, from: &Path, to: &Path) -> Result<(), String> {
        fs::create_dir_all(to).map_err(|e| io("creating", to, e))?;
        run("mount", args!["--bind", from, to])?;
        self.0.push(to.to_path_buf());
        Ok(())
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for target in self.0.iter().rev() {
            if let Err(e) = run("umount", args![target]) {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// The supervisor and the engine, built in the chroot for the target CPU, from the crates the
/// host already fetched (`cargo fetch`), so the chroot needs no network.
fn cross_build(d: &Definition, paths: &Paths, builder: &Path) -> Result<Vec<PathBuf>, String> {
    status(
        Command::new("cargo")
            .args(["fetch", "--locked", "--manifest-path"])
            .arg(paths.repo.join("Cargo.toml")),
    )?;
    let source = builder.join("build/src");
    if source.exists() {
        fs::remove_dir_all(&source).map_err(|e| io("clearing", &source, e))?;
    }
    copy_tracked(&paths.repo, &source)?;
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let mut mounts = Mounts(Vec::new());
    mounts.bind(Path::new("/proc"), &builder.join("proc"))?;
    mounts.bind(Path::new("/dev"), &builder.join("dev"))?;
    mounts.bind(
        &cargo_home.join("registry"),
        &builder.join("root/.cargo/registry"),
    )?;
    let target = &d.builder.target;
    let linker_var = format!(
        "CARGO_TARGET_{}_LINKER",
        target.to_ascii_uppercase().replace('-', "_")
    );
    status(
        Command::new("chroot")
            .arg(builder)
            .args(["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "HOME=/root"])
            .arg("CARGO_HOME=/root/.cargo")
            .arg("CARGO_TARGET_DIR=/build/target")
            .arg(format!("{linker_var}=aarch64-linux-gnu-gcc"))
            .arg(format!("RUSTFLAGS=-C target-cpu={}", d.builder.target_cpu))
            .args(["cargo", "build", "--release", "--locked", "--offline"])
            .args([
                "--manifest-path",
                "/build/src/Cargo.toml",
                "--target",
                target,
            ])
            .args(["-p", "supervisor", "-p", "engine"]),
    )?;
    drop(mounts);
    let release = builder.join("build/target").join(target).join("release");
    Ok(vec![release.join("supervisor"), release.join("engine")])
}

/// Copies the files git tracks (the build never sees local junk or `target/`).
fn copy_tracked(repo: &Path, to: &Path) -> Result<(), String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["ls-files", "-z"])
        .output()
        .map_err(|e| format!("git ls-files: {e}"))?;
    if !output.status.success() {
        return Err("git ls-files failed: build from a git checkout".into());
    }
    for name in output.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let relative = Path::new(std::str::from_utf8(name).map_err(|e| e.to_string())?);
        let (from, dest) = (repo.join(relative), to.join(relative));
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(|e| io("creating", parent, e))?;
        }
        // A tracked file deleted in the work tree is simply not copied.
        if from.is_file() {
            fs::copy(&from, &dest).map_err(|e| io("copying", &from, e))?;
        }
    }
    Ok(())
}

/// The package layer of the root filesystem (arm64, minbase), cached as a `.tar.zst`.
fn package_rootfs(d: &Definition, paths: &Paths, mirror: &str) -> Result<PathBuf, String> {
    let r = &d.rootfs;
    let mut packages = r.packages.clone();
    packages.push(r.kernel.clone());
    let joined = packages.join(",");
    let tarball = paths.cache.join(format!(
        "rootfs-{}.tar.zst",
        key(&[&r.suite, &joined, mirror, &r.components.join(" ")])
    ));
    if tarball.exists() {
        return Ok(tarball);
    }
    let partial = tarball.with_extension("partial.tar.zst");
    let (pinned, preferences) = pins(&r.suite, &packages);
    let prefs_file = paths.cache.join("apt-preferences");
    write(&prefs_file, &preferences)?;
    if prefs_file.to_string_lossy().contains(char::is_whitespace) {
        return Err(format!(
            "{}: mmdebstrap's copy-in takes no paths with spaces; build from a checkout without them",
            prefs_file.display()
        ));
    }
    let mut command = args![
        "--variant=minbase",
        "--architectures=arm64",
        format!("--include={}", pinned.join(",")),
        format!("--aptopt=APT::Default-Release \"{}\"", r.suite),
        // mmdebstrap copies the file itself (no shell).
        format!(
            "--setup-hook=copy-in {} /etc/apt/preferences.d/",
            prefs_file.display()
        ),
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        &r.suite,
        &partial
    ];
    command.extend(sources(
        &r.suite,
        mirror,
        &extra_suites(&packages),
        &r.components,
    ));
    run("mmdebstrap", command)?;
    fs::rename(&partial, &tarball).map_err(|e| io("placing", &tarball, e))?;
    Ok(tarball)
}

/// The package list as apt is given it, and the pins that make it so. A package named
/// `package/<suite>-backports` stays so named (backports are never chosen on their own). One
/// named `package/<other suite>` (a newer release) is pinned to that suite by name, and
/// everything else of that suite is pinned below the definition's suite: asking apt for
/// `package/suite` would also take its dependencies (even libc6) from there.
fn pins(suite: &str, packages: &[String]) -> (Vec<String>, String) {
    let mut plain = Vec::new();
    let mut pinned: Vec<(String, Vec<String>)> = Vec::new();
    for package in packages {
        match package.split_once('/') {
            Some((name, from)) if !from.starts_with(&format!("{suite}-")) => {
                plain.push(name.to_string());
                match pinned.iter_mut().find(|(s, _)| s == from) {
                    Some((_, names)) => names.push(name.to_string()),
                    None => pinned.push((from.to_string(), vec![name.to_string()])),
                }
            }
            _ => plain.push(package.clone()),
        }
    }
    let mut preferences =
        String::from("# Written by appliance-image build from the image definition.\n");
    for (from, names) in &pinned {
        preferences.push_str(&format!(
            "\nPackage: *\nPin: release n={from}\nPin-Priority: 100\n\nPackage: {}\nPin: release n={from}\nPin-Priority: 995\n",
            names.join(" ")
        ));
    }
    (plain, preferences)
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    fs::create_dir_all(to).map_err(|e| io("creating", to, e))?;
    let mut source = from.as_os_str().to_os_string();
    source.push("/.");
    run("cp", args!["-a", "--no-preserve=ownership", source, to])
}

/// Overlays, units, binaries, manifests and the mount table on the root filesystem.
fn customize_root(
    d: &Definition,
    paths: &Paths,
    root: &Path,
    binaries: &[PathBuf],
    built: u64,
) -> Result<(), String> {
    for overlay in &d.overlays.rootfs {
        copy_tree(&paths.repo.join(overlay), root)?;
    }
    remove_ssh_host_keys(root)?;
    let units = root.join("usr/lib/systemd/system");
    let wants = root.join("etc/systemd/system/multi-user.target.wants");
    fs::create_dir_all(&wants).map_err(|e| io("creating", &wants, e))?;
    let unit_dir = paths.repo.join(&d.overlays.units);
    for entry in fs::read_dir(&unit_dir).map_err(|e| io("listing", &unit_dir, e))? {
        let path = entry.map_err(|e| io("listing", &unit_dir, e))?.path();
        let is_unit = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ["service", "slice", "socket", "target", "timer"].contains(&e));
        if let (true, Some(name)) = (is_unit, path.file_name()) {
            fs::copy(&path, units.join(name)).map_err(|e| io("copying", &path, e))?;
        }
    }
    for unit in &d.overlays.enable {
        if !units.join(unit).exists() {
            return Err(format!(
                "overlays.enable names {unit}, which is neither in {} nor in the packages",
                d.overlays.units
            ));
        }
        let link = wants.join(unit);
        if !link.exists() {
            std::os::unix::fs::symlink(format!("/usr/lib/systemd/system/{unit}"), &link)
                .map_err(|e| io("enabling", &link, e))?;
        }
    }
    let bin = root.join("usr/bin");
    for binary in binaries {
        let name = binary.file_name().ok_or("a binary without a name")?;
        fs::copy(binary, bin.join(name)).map_err(|e| io("copying", binary, e))?;
    }
    let manifests = root.join("usr/share/appliance/models");
    fs::create_dir_all(&manifests).map_err(|e| io("creating", &manifests, e))?;
    let models = paths.repo.join("models");
    for entry in fs::read_dir(&models).map_err(|e| io("listing", &models, e))? {
        let path = entry.map_err(|e| io("listing", &models, e))?.path();
        if let (Some("toml"), Some(name)) =
            (path.extension().and_then(|e| e.to_str()), path.file_name())
        {
            fs::copy(&path, manifests.join(name)).map_err(|e| io("copying", &path, e))?;
        }
    }
    let id = d.layout.disk_id;
    let fstab = format!(
        "# The root is read-only (`ro` on the slot's kernel command line, which names the root\n\
         # partition: the same system runs from either slot, so no root line here); state lives\n\
         # on the data partition, logs in RAM.\n\
         PARTUUID={} /boot/firmware vfat defaults,noatime,umask=0077 0 2\n\
         PARTUUID={} /var/lib/appliance ext4 defaults,noatime 0 2\n\
         # What services keep under /var lives in RAM (logind, networkd, timers).\n\
         tmpfs /var/lib/systemd tmpfs mode=0755,nosuid,nodev 0 0\n\
         tmpfs /var/tmp tmpfs mode=1777,nosuid,nodev 0 0\n\
         tmpfs /var/log tmpfs mode=0755,nosuid,nodev 0 0\n",
        layout::partuuid(id, 1),
        layout::partuuid(id, 4)
    );
    write(&root.join("etc/fstab"), &fstab)?;
    for dir in ["boot/firmware", "var/lib/appliance"] {
        fs::create_dir_all(root.join(dir)).map_err(|e| io("creating", &root.join(dir), e))?;
    }
    // The box never runs with a clock earlier than its image (see the supervisor's clock
    // floor).
    write(
        &root.join("usr/share/appliance/build-time"),
        &format!("{built}\n"),
    )?;
    // Empty: systemd makes a transient id on the read-only root at every boot.
    write(&root.join("etc/machine-id"), "")
}

/// The SSH host keys a package made while the image was built: every card would share them.
/// Each box makes its own on its data partition (`/usr/libexec/appliance/ssh-host-key`).
fn remove_ssh_host_keys(root: &Path) -> Result<(), String> {
    let dir = root.join("etc/ssh");
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry.map_err(|e| io("listing", &dir, e))?.path();
        let is_host_key = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("ssh_host_"));
        if is_host_key {
            fs::remove_file(&path).map_err(|e| io("removing", &path, e))?;
        }
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| io("creating", parent, e))?;
    }
    fs::write(path, text).map_err(|e| io("writing", path, e))
}

/// `config.txt` as assembled from the fragments in `dir`.
pub fn assembled_config_txt(dir: &Path) -> Result<String, String> {
    config_txt::assemble(&config_txt::read_dir(dir)?, &dir.display().to_string())
}

/// The boot partition's files: config.txt and the fragments it is assembled from (the
/// supervisor regenerates it from them on the box), autoboot.txt, and slot A's folder: kernel,
/// initramfs, device trees and its cmdline.txt (root partition 2, `rauc.slot=A`). Slot B's
/// folder is made by the first update into it.
fn boot_files(d: &Definition, paths: &Paths, root: &Path, boot: &Path) -> Result<PathBuf, String> {
    fs::create_dir_all(boot).map_err(|e| io("creating", boot, e))?;
    let fragment_src = paths.repo.join(&d.overlays.config_txt);
    let fragments = config_txt::read_dir(&fragment_src)?;
    let config = config_txt::assemble(&fragments, &fragment_src.display().to_string())?;
    if config_txt::setting(&config, "os_prefix") != Some("slot-a/") {
        return Err(format!(
            "the config.txt fragments in {} must boot slot A (os_prefix=slot-a/, in 15-slot.txt)",
            fragment_src.display()
        ));
    }
    write(&boot.join("config.txt"), &config)?;
    for fragment in &fragments {
        write(
            &boot.join(config_txt::FRAGMENT_DIR).join(&fragment.name),
            &fragment.text,
        )?;
    }
    let boot_src = paths.repo.join(&d.overlays.boot);
    fs::copy(boot_src.join("autoboot.txt"), boot.join("autoboot.txt"))
        .map_err(|e| io("copying", &boot_src.join("autoboot.txt"), e))?;
    let slot = boot.join("slot-a");
    copy_tree(&root.join(SLOT_BOOT_DIR), &slot)?;
    let cmdline = fs::read_to_string(boot_src.join("cmdline.txt"))
        .map_err(|e| io("reading", &boot_src.join("cmdline.txt"), e))?
        .replace("{root}", &layout::partuuid(d.layout.disk_id, 2))
        .replace("{slot}", "A");
    write(&slot.join("cmdline.txt"), &cmdline)?;
    Ok(boot.to_path_buf())
}

/// The data partition's files: empty, or the default model installed as a box would have it.
fn data_files(paths: &Paths, data: &Path, options: &Options) -> Result<PathBuf, String> {
    fs::create_dir_all(data).map_err(|e| io("creating", data, e))?;
    let Some(cache) = &options.model_cache else {
        return Ok(data.to_path_buf());
    };
    // The host's supervisor installs through the manifest into a stand-in board whose data
    // directory becomes the partition's root.
    let board = paths.work().join("model-board");
    let supervisor = |args: Vec<OsString>| {
        status(
            Command::new("cargo")
                .args([
                    "run",
                    "--quiet",
                    "--locked",
                    "-p",
                    "supervisor",
                    // The stand-in board is a simulated one.
                    "--features",
                    "sim",
                    "--manifest-path",
                ])
                .arg(paths.repo.join("Cargo.toml"))
                .arg("--")
                .args(args),
        )
    };
    supervisor(args!["sim", "init", &board])?;
    supervisor(args![
        "--root",
        &board,
        "weights",
        "fetch-default",
        "--cache",
        cache
    ])?;
    copy_tree(&board.join("var/lib/appliance"), data)?;
    Ok(data.to_path_buf())
}

/// Partition images written into one sparse disk image, then renamed into place with its
/// checksum.
fn disk_image(
    d: &Definition,
    paths: &Paths,
    root: &Path,
    boot: &Path,
    data: &Path,
) -> Result<PathBuf, String> {
    let work = paths.work();
    let (parts, size) = layout::partitions(&d.layout);
    let image = paths.out.join(format!("{}.img", d.name));
    let partial = paths.out.join(format!("{}.img.partial", d.name));
    let file = fs::File::create(&partial).map_err(|e| io("creating", &partial, e))?;
    file.set_len(size).map_err(|e| io("sizing", &partial, e))?;
    drop(file);
    with_input(
        "sfdisk",
        &["--quiet", &partial.to_string_lossy()],
        &layout::sfdisk_script(&d.layout),
    )?;
    for p in &parts {
        let fs_image = work.join(format!("{}.fs", p.role.label()));
        let size_arg = format!("{}k", p.size / 1024);
        match p.role {
            Role::Boot => {
                fs::File::create(&fs_image)
                    .and_then(|f| f.set_len(p.size))
                    .map_err(|e| io("creating", &fs_image, e))?;
                let id = format!("{:08x}", d.layout.disk_id);
                run(
                    "mkfs.vfat",
                    args!["-F", "32", "-n", "BOOT", "-i", id, &fs_image],
                )?;
                let mut copy = args!["-s", "-i", &fs_image];
                for entry in fs::read_dir(boot).map_err(|e| io("listing", boot, e))? {
                    copy.push(entry.map_err(|e| io("listing", boot, e))?.path().into());
                }
                copy.push("::/".into());
                run("mcopy", copy)?;
            }
            Role::RootA => run(
                "mkfs.ext4",
                args!["-q", "-F", "-L", "root-a", "-d", root, &fs_image, &size_arg],
            )?,
            Role::RootB => run(
                "mkfs.ext4",
                args!["-q", "-F", "-L", "root-b", &fs_image, &size_arg],
            )?,
            Role::Data => run(
                "mkfs.ext4",
                args!["-q", "-F", "-L", "data", "-d", data, &fs_image, &size_arg],
            )?,
        }
        place(&fs_image, &partial, p.start)?;
        // The root filesystem image also goes into the update bundle.
        if p.role != Role::RootA {
            fs::remove_file(&fs_image).map_err(|e| io("removing", &fs_image, e))?;
        }
    }
    fs::File::open(&partial)
        .and_then(|f| f.sync_all())
        .map_err(|e| io("syncing", &partial, e))?;
    fs::rename(&partial, &image).map_err(|e| io("placing", &image, e))?;
    let digest = sha256_file(&image)?;
    let name = image
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let sums = paths.out.join(format!("{name}.sha256"));
    let partial_sums = sums.with_extension("sha256.partial");
    write(&partial_sums, &format!("{digest}  {name}\n"))?;
    fs::rename(&partial_sums, &sums).map_err(|e| io("placing", &sums, e))?;
    Ok(image)
}

/// Copies a filesystem image into the disk at `offset`, leaving zero runs as holes.
fn place(part: &Path, disk: &Path, offset: u64) -> Result<(), String> {
    let mut from = fs::File::open(part).map_err(|e| io("opening", part, e))?;
    let mut to = fs::OpenOptions::new()
        .write(true)
        .open(disk)
        .map_err(|e| io("opening", disk, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = offset;
    loop {
        let n = from.read(&mut buf).map_err(|e| io("reading", part, e))?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|&b| b != 0) {
            to.seek(SeekFrom::Start(at))
                .and_then(|_| to.write_all(&buf[..n]))
                .map_err(|e| io("writing", disk, e))?;
        }
        at += n as u64;
    }
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String, String> {
    let mut file = fs::File::open(path).map_err(|e| io("opening", path, e))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| io("reading", path, e))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::{key, pins, place};

    #[test]
    fn packages_of_a_newer_suite_are_pinned_by_name() {
        let packages = [
            "dbus".to_string(),
            "rauc/forky".to_string(),
            "libnl-3-200/forky".to_string(),
            "linux-image-arm64/trixie-backports".to_string(),
        ];
        let (names, preferences) = pins("trixie", &packages);
        assert_eq!(
            names,
            [
                "dbus",
                "rauc",
                "libnl-3-200",
                "linux-image-arm64/trixie-backports"
            ]
        );
        assert!(preferences.contains(
            "Package: *\nPin: release n=forky\nPin-Priority: 100\n\nPackage: rauc libnl-3-200\nPin: release n=forky\nPin-Priority: 995\n"
        ));
        assert!(!preferences.contains("backports"));
    }

    #[test]
    fn layer_keys_change_with_any_input() {
        assert_eq!(key(&["trixie", "a,b"]), key(&["trixie", "a,b"]));
        assert_ne!(key(&["trixie", "a,b"]), key(&["trixie", "a,c"]));
        assert_ne!(key(&["trixie", "ab"]), key(&["trixi", "eab"]));
    }

    #[test]
    fn a_partition_lands_at_its_offset_and_zeros_stay_holes() {
        use std::os::unix::fs::MetadataExt;

        const MIB: usize = 1 << 20;
        let dir = tempfile::tempdir().expect("tempdir");
        let (part, disk) = (dir.path().join("p"), dir.path().join("d"));
        // Three MiB, the middle one all zeros: written, it would take a MiB on the host.
        let mut content = vec![0u8; 3 * MIB];
        content[5] = 7;
        content[2 * MIB + 9] = 9;
        std::fs::write(&part, &content).expect("part");
        std::fs::File::create(&disk)
            .and_then(|f| f.set_len(8 * MIB as u64))
            .expect("disk");
        place(&part, &disk, 4 * MIB as u64).expect("placed");

        let mut expected = vec![0u8; 8 * MIB];
        expected[4 * MIB..7 * MIB].copy_from_slice(&content);
        let written = std::fs::read(&disk).expect("read");
        assert_eq!(written.len(), expected.len(), "the disk keeps its size");
        assert!(
            written == expected,
            "the disk holds the partition at its offset"
        );
        // Only the two MiB with data are allocated (st_blocks counts 512-byte units, plus a
        // few blocks of the host filesystem's own metadata): the zero MiB is a hole.
        let allocated = std::fs::metadata(&disk).expect("stat").blocks() * 512;
        assert!(
            allocated <= (2 * MIB + MIB / 4) as u64,
            "{allocated} bytes allocated for 2 MiB of data"
        );
    }
}
