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
    /// Build out/<name>.img and its .sha256 (as root: it makes chroots).
    Build {
        /// Put the default model on the data partition (fetched into this cache), as a
        /// provisioned box has it.
        #[arg(long)]
        with_model: Option<PathBuf>,
    },
    /// Stamp a copy of the built image for one box, boot it under QEMU twice and check the
    /// engine answers and the box took its identity (once).
    QemuTest {
        /// Host port forwarded to the guest's engine; the next two go to its HTTPS and plain
        /// HTTP dashboard.
        #[arg(long, default_value_t = 18080)]
        port: u16,
        /// Seconds to wait for the engine.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
    },
}

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
        Cmd::Build { with_model } => {
            let options = Options {
                model_cache: with_model,
            };
            let built = pipeline::build(&definition, &paths, &options)?;
            println!(
                "{}: {} MiB ({} MiB allocated); root filesystem {} MiB",
                built.image.display(),
                built.size >> 20,
                built.allocated >> 20,
                built.rootfs_bytes >> 20
            );
            Ok(())
        }
        Cmd::QemuTest { port, timeout } => {
            let image = paths.out.join(format!("{}.img", definition.name));
            let report = qemu::smoke_test(
                &definition,
                &paths,
                &image,
                port,
                Duration::from_secs(timeout),
            )?;
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
