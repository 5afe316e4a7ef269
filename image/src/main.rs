//! `appliance-image`: the command line. Parsing only.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use appliance_image::definition::Definition;
use appliance_image::pipeline::{self, Options, Paths};
use appliance_image::qemu;
use clap::{Parser, Subcommand};

/// Builds the Appliance's Raspberry Pi 5 image and boots it under QEMU.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// The image definition.
    #[arg(long, default_value = "image/appliance-rpi5.toml")]
    definition: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check the definition and print the partition table and config.txt.
    Check,
    /// Build out/<name>.img and its .sha256, and the signed update bundle of the same system,
    /// out/<name>-<version>.raucb (as root: it makes chroots).
    Build {
        /// Put the default model on the data partition (fetched into this cache), as a
        /// provisioned box has it.
        #[arg(long)]
        with_model: Option<PathBuf>,
        /// The system version (digits and dots); default: the build time, YYYY.MM.DD.HHMMSS.
        #[arg(long)]
        version: Option<String>,
        /// The fleet's PEM private key that signs the bundle (with --signing-cert); without
        /// both, a development pair in out/keys/ is used (made once).
        #[arg(long, requires = "signing_cert")]
        signing_key: Option<PathBuf>,
        /// The PEM X.509 certificate of the signing key; the image trusts bundles it signed.
        #[arg(long, requires = "signing_key")]
        signing_cert: Option<PathBuf>,
        /// For the rollback test: an engine that exits at once.
        #[arg(long, hide = true)]
        test_broken_engine: bool,
    },
    /// A/B updates under QEMU, the harness playing the firmware: IMAGE (version V1) installs
    /// GOOD (V2) from a USB stick, reboots into it and commits; then BROKEN (V3, built with
    /// --test-broken-engine) rolls back by itself.
    QemuUpdateTest {
        /// The image of the first version.
        #[arg(long)]
        image: PathBuf,
        /// A healthy bundle of a newer version.
        #[arg(long)]
        bundle: PathBuf,
        /// A bundle of a still newer version whose engine cannot run.
        #[arg(long)]
        broken_bundle: PathBuf,
        /// The three versions, in order.
        #[arg(long, num_args = 3, value_names = ["V1", "V2", "V3"])]
        versions: Vec<String>,
        /// Host port forwarded to the guest's engine; the next three to HTTPS, HTTP and SSH.
        #[arg(long, default_value_t = 18090)]
        port: u16,
        /// Seconds for each stage (boot, install, check).
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// Stamp a copy of the built image for one box, boot it under QEMU and check the engine
    /// answers, the box took its identity (once), a model pushed to it is switched to, and a
    /// signed USB stick re-provisions it.
    QemuTest {
        /// Host port forwarded to the guest's engine; the next two go to its HTTPS and plain
        /// HTTP dashboard.
        #[arg(long, default_value_t = 18080)]
        port: u16,
        /// Where the default model's file is cached (fetched there when missing): the test
        /// pushes it to the box under another id.
        #[arg(long, default_value = "target/tmp/model-cache")]
        model_cache: PathBuf,
        /// Seconds to wait for the engine.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
    },
}

/// The image's default model: the QEMU test pushes its file under another id.
const DEFAULT_MANIFEST: &str = include_str!("../../models/smollm2-135m-instruct-q4_1.toml");

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let repo = std::env::current_dir().map_err(|e| e.to_string())?;
    let definition = Definition::load(&repo.join(&cli.definition))?;
    let paths = Paths::for_repo(&repo);
    match cli.command {
        Cmd::Check => {
            print!(
                "{}",
                appliance_image::layout::sfdisk_script(&definition.layout)
            );
            println!();
            print!(
                "{}",
                appliance_image::pipeline::assembled_config_txt(
                    &repo.join(&definition.overlays.config_txt)
                )?
            );
            Ok(())
        }
        Cmd::Build {
            with_model,
            version,
            signing_key,
            signing_cert,
            test_broken_engine,
        } => {
            let options = Options {
                model_cache: with_model,
                version,
                signing: signing_key
                    .zip(signing_cert)
                    .map(|(key, cert)| appliance_image::bundle::Signing { key, cert }),
                broken_engine: test_broken_engine,
            };
            let built = pipeline::build(&definition, &paths, &options)?;
            println!(
                "{}: version {}, {} MiB ({} MiB allocated); root filesystem {} MiB; update bundle {}",
                built.image.display(),
                built.version,
                built.size >> 20,
                built.allocated >> 20,
                built.rootfs_bytes >> 20,
                built.bundle.display()
            );
            Ok(())
        }
        Cmd::QemuUpdateTest {
            image,
            bundle,
            broken_bundle,
            versions,
            port,
            timeout,
        } => {
            let [v1, v2, v3] = versions.as_slice() else {
                return Err("--versions takes three versions".into());
            };
            let report = appliance_image::qemu_update::update_test(
                &definition,
                &paths,
                &image,
                &bundle,
                &broken_bundle,
                [v1, v2, v3],
                port,
                Duration::from_secs(timeout),
            )?;
            println!(
                "versions running, in order: {}; version {v2} committed {:.0} s after its stick was plugged in; version {v3} rolled back {:.0} s after its stick was plugged in: {}",
                report.versions.join(" → "),
                report.install_to_commit.as_secs_f64(),
                report.install_to_rollback.as_secs_f64(),
                report.rollback_reason
            );
            Ok(())
        }
        Cmd::QemuTest {
            port,
            timeout,
            model_cache,
        } => {
            let image = paths.out.join(format!("{}.img", definition.name));
            let default = weights::Manifest::parse(DEFAULT_MANIFEST, "the default manifest")
                .map_err(|e| e.to_string())?;
            let model =
                weights::fetch::source(&default, &model_cache).map_err(|e| e.to_string())?;
            let report = qemu::smoke_test(
                &definition,
                &paths,
                &image,
                port,
                Duration::from_secs(timeout),
                &model,
            )?;
            println!("model pushed and switched to: {}", report.model_push);
            println!(
                "multi-user.target {:.0} s and the engine {:.0} s after QEMU started; completion: {}",
                report.boot_to_multi_user.as_secs_f64(),
                report.boot_to_engine.as_secs_f64(),
                report.completion
            );
            println!(
                "data partition after first boot: {} MiB",
                report.data_bytes >> 20
            );
            println!(
                "provisioned as {} (HTTPS login, API token, plain HTTP redirected, boot file scrubbed, SSH: {}); second boot served HTTPS {:.0} s after QEMU started and applied nothing again; a third boot with the signed USB stick served its generation {:.0} s after QEMU started",
                report.hostname,
                report.ssh_banner,
                report.second_boot_to_https.as_secs_f64(),
                report.usb_to_https.as_secs_f64()
            );
            Ok(())
        }
    }
}
