//! `appliance`: the command line. Parsing only; each subcommand is a few library calls.
//!
//! Exit status: 0 success, 1 the operation failed, 2 bad input (arguments, fleet file).

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use operator::fleet;
use operator::stamp::{self, Target};
use provision::{FleetFile, PROVISION_FILE};

/// Prepares cards for a fleet of Appliance boxes.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct Whom {
    /// The fleet file (fleet.toml).
    #[arg(long)]
    fleet: PathBuf,
    /// The box (its `name` in the fleet file) the card is for.
    #[arg(long = "box", value_name = "NAME", required_unless_present = "all")]
    box_name: Option<String>,
    /// One card for every box: the whole fleet file, each box taking its entry by serial.
    #[arg(long, conflicts_with = "box_name")]
    all: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Check a fleet file and list its boxes (exit 2 naming the key and line when it is wrong).
    Check {
        /// The fleet file.
        fleet: PathBuf,
    },
    /// Write a copy of IMAGE to OUT whose boot partition holds the box's provisioning file.
    Stamp {
        #[command(flatten)]
        whom: Whom,
        /// The Appliance image (appliance-rpi5.img).
        image: PathBuf,
        /// The stamped copy.
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
    /// Write IMAGE to a card (refusing a mounted or system disk), read it back and check its
    /// SHA-256, then stamp the card for the box.
    Flash {
        #[command(flatten)]
        whom: Whom,
        /// The Appliance image.
        image: PathBuf,
        /// The card's whole-disk device (e.g. /dev/sdb, /dev/mmcblk0, /dev/nvme1n1).
        device: PathBuf,
    },
    /// Write a signed provisioning file for a USB stick labelled APPLIANCE into DIR (the
    /// stick's mount point): boxes that trust the fleet key apply it when it is plugged in.
    Usb {
        #[command(flatten)]
        whom: Whom,
        /// The fleet's secret signing key (`supervisor weights keygen`; its public key is the
        /// fleet file's fleet_key).
        #[arg(long)]
        key: PathBuf,
        /// The stick's mount point.
        dir: PathBuf,
    },
    /// Model files: a manifest the engine checked, signed with the fleet key.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// The fleet on the network.
    Fleet {
        #[command(subcommand)]
        command: FleetCommand,
    },
    /// Read a Wi-Fi passphrase from stdin and print its WPA PSK for `network.wifi.psk`
    /// (the passphrase itself never goes into a fleet file).
    WifiPsk {
        /// The network's name.
        #[arg(long)]
        ssid: String,
    },
}

#[derive(clap::Args)]
struct Reach {
    /// The fleet file (fleet.lock and fleet.secret are kept beside it).
    fleet: PathBuf,
    /// A file holding an API token the boxes accept (else $APPLIANCE_API_TOKEN).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Where a box answers, NAME=HOST:PORT (default: where it enrolled, else its static
    /// address or host name, port 8443). Repeatable.
    #[arg(long = "at", value_name = "NAME=HOST:PORT")]
    at: Vec<String>,
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Make the manifest for a model's files (its weights, then its draft head if it has
    /// one): the engine loads them and reports the context that fits 4, 8 and 16 GB boards,
    /// which the manifest records with the engine settings.
    Manifest {
        /// The weights (GGUF).
        file: PathBuf,
        /// The draft head (Gemma 4's MTP assistant), if the model has one.
        draft: Option<PathBuf>,
        /// A template with the id, name and engine settings (models/*.template.toml).
        #[arg(long)]
        template: Option<PathBuf>,
        /// The model's id (default: the template's, else from the file name).
        #[arg(long)]
        id: Option<String>,
        /// Bytes per verification chunk (default 16 MiB; a push takes at most 64 MiB).
        #[arg(long)]
        chunk_size: Option<u64>,
        /// The engine binary to ask (default: beside this tool, else on PATH).
        #[arg(long)]
        engine: Option<PathBuf>,
        /// Where to write the manifest (default: stdout).
        #[arg(short = 'o', long = "out")]
        out: Option<PathBuf>,
    },
    /// Sign a manifest with the fleet's secret key: MANIFEST.sig, which every box that trusts
    /// the fleet key accepts.
    Sign {
        /// The manifest.
        manifest: PathBuf,
        /// The fleet's secret key (`supervisor weights keygen`).
        #[arg(long)]
        key: PathBuf,
    },
}

#[derive(clap::Args)]
struct Boxes {
    /// The box (its name in the fleet file).
    #[arg(long = "box", value_name = "NAME", required_unless_present = "all")]
    box_name: Option<String>,
    /// Every box of the fleet, one at a time, stopping at the first that fails.
    #[arg(long, conflicts_with = "box_name")]
    all: bool,
}

#[derive(Subcommand)]
enum FleetModelCommand {
    /// Push a signed model to boxes: resumable, each chunk verified by the box as it arrives,
    /// after the box checked it has room; installed once complete (not switched to).
    Push {
        #[command(flatten)]
        reach: Reach,
        #[command(flatten)]
        boxes: Boxes,
        /// The signed manifest (MANIFEST.sig beside it).
        manifest: PathBuf,
        /// The weights, then the draft head if the model has one.
        #[arg(required = true, num_args = 1..=2)]
        files: Vec<PathBuf>,
    },
    /// Switch boxes to an installed model: each relaunches its engine on it and keeps it only
    /// if it answers within the deadline, else goes back to the model before by itself.
    Use {
        #[command(flatten)]
        reach: Reach,
        #[command(flatten)]
        boxes: Boxes,
        /// The model's id.
        id: String,
        /// Seconds each box has for its verdict.
        #[arg(long, default_value_t = 600)]
        wait: u64,
    },
    /// Remove a model from boxes (never their active or fallback model).
    Rm {
        #[command(flatten)]
        reach: Reach,
        #[command(flatten)]
        boxes: Boxes,
        /// The model's id.
        id: String,
    },
    /// Each box's models: active (*), fallback (f), size, signer, verification, pushes under
    /// way, the last switch.
    List {
        #[command(flatten)]
        reach: Reach,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum FleetCommand {
    /// Models on the boxes: push, use, rm, list.
    Model {
        #[command(subcommand)]
        command: FleetModelCommand,
    },
    /// Enrol every box not yet in fleet.lock: each proves it holds the token its card was
    /// stamped with, and its device key and certificate are recorded.
    Enroll {
        #[command(flatten)]
        reach: Reach,
    },
    /// Update every box with a signed bundle, one at a time: each must come back on the new
    /// version, committed, before the next is touched; the first that fails (or rolls back)
    /// stops the rollout.
    Update {
        #[command(flatten)]
        reach: Reach,
        /// The bundle (`out/appliance-rpi5-VERSION.raucb` from `appliance-image build`).
        bundle: PathBuf,
        /// Seconds each box has from its upload to its verdict.
        #[arg(long, default_value_t = 2700)]
        wait: u64,
    },
    /// Every box: reachable, identity as enrolled, OS and slot, model, engine, speed,
    /// temperature, throttling, uptime, provisioning generation.
    Status {
        #[command(flatten)]
        reach: Reach,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Check { fleet } => check(&fleet),
        Command::Stamp { whom, image, out } => stamped(&whom).and_then(|text| {
            stamp::stamp_copy(&image, &out, &text).map_err(failed)?;
            println!(
                "{}: {} written for {}",
                out.display(),
                PROVISION_FILE,
                describe(&whom)
            );
            Ok(())
        }),
        Command::Flash {
            whom,
            image,
            device,
        } => stamped(&whom).and_then(|text| flash(&image, &device, &text, &whom)),
        Command::WifiPsk { ssid } => wifi_psk(&ssid),
        Command::Usb { whom, key, dir } => stamped(&whom).and_then(|text| usb(&text, &key, &dir)),
        Command::Fleet {
            command: FleetCommand::Enroll { reach },
        } => enroll(&reach),
        Command::Model { command } => model(command),
        Command::Fleet {
            command: FleetCommand::Model { command },
        } => fleet_model(command),
        Command::Fleet {
            command: FleetCommand::Status { reach, json },
        } => status(&reach, json),
        Command::Fleet {
            command:
                FleetCommand::Update {
                    reach,
                    bundle,
                    wait,
                },
        } => update(&reach, &bundle, wait),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

type Failure = (u8, String);

fn bad_input(message: impl std::fmt::Display) -> Failure {
    (2, message.to_string())
}

fn failed(message: impl std::fmt::Display) -> Failure {
    (1, message.to_string())
}

fn describe(whom: &Whom) -> String {
    match &whom.box_name {
        Some(name) => format!("box {name}"),
        None => "every box of the fleet".into(),
    }
}

fn read_fleet(path: &Path) -> Result<FleetFile, Failure> {
    let text =
        std::fs::read_to_string(path).map_err(|e| bad_input(format!("{}: {e}", path.display())))?;
    FleetFile::parse(&text, &path.display().to_string()).map_err(bad_input)
}

fn stamped(whom: &Whom) -> Result<String, Failure> {
    let fleet = read_fleet(&whom.fleet)?;
    let target = match &whom.box_name {
        Some(name) => Target::Box(name),
        None => Target::WholeFleet,
    };
    let secret = fleet::secret(&fleet::Paths::beside(&whom.fleet)).map_err(failed)?;
    stamp::provisioning_text(&fleet, &target, &secret).map_err(bad_input)
}

fn check(path: &Path) -> Result<(), Failure> {
    let fleet = read_fleet(path)?;
    println!(
        "fleet {}, generation {}: {} boxes",
        fleet.fleet.name,
        fleet.fleet.generation,
        fleet.boxes.len()
    );
    for entry in &fleet.boxes {
        let settings = entry.over(&fleet.fleet.defaults);
        let show = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        println!(
            "  {:20} serial {:16}  host {:20} address {:18} password {}  tokens {}",
            show(settings.name.as_ref().map(|n| n.to_string())),
            show(settings.serial.as_ref().map(|s| s.to_string())),
            show(settings.effective_hostname().map(|h| h.to_string())),
            show(
                settings
                    .network
                    .as_ref()
                    .and_then(|n| n.address)
                    .map(|a| a.to_string())
            ),
            if settings.password_hash.is_some() {
                "set"
            } else {
                "none (dashboard on loopback only)"
            },
            settings.api_token_sha256.as_ref().map_or(0, Vec::len),
        );
    }
    Ok(())
}

fn flash(image: &Path, device: &Path, text: &str, whom: &Whom) -> Result<(), Failure> {
    let interactive = std::io::stderr().is_terminal();
    let mut last_percent = u64::MAX;
    let sha = operator::flash::write_and_verify(image, device, |what, done, total| {
        let percent = done * 100 / total.max(1);
        if percent != last_percent {
            last_percent = percent;
            let line = format!(
                "{what} {} MiB of {} MiB ({percent}%)",
                done >> 20,
                total >> 20
            );
            if interactive {
                eprint!("\r{line}   ");
            } else if percent % 10 == 0 {
                eprintln!("{line}");
            }
            let _ = std::io::stderr().flush();
        }
    })
    .map_err(failed)?;
    if interactive {
        eprintln!();
    }
    println!(
        "{}: image written and read back, SHA-256 {sha}",
        device.display()
    );
    stamp::write_boot_file(device, PROVISION_FILE, text.as_bytes()).map_err(failed)?;
    println!(
        "{}: {PROVISION_FILE} written for {}",
        device.display(),
        describe(whom)
    );
    Ok(())
}

/// The fleet, its API token and address overrides.
type Reached = (FleetFile, String, Vec<(String, String)>);

fn reach(reach: &Reach) -> Result<Reached, Failure> {
    let fleet = read_fleet(&reach.fleet)?;
    let token = match &reach.token_file {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| bad_input(format!("{}: {e}", file.display())))?,
        None => std::env::var("APPLIANCE_API_TOKEN").map_err(|_| {
            bad_input("no API token: pass --token-file FILE or set APPLIANCE_API_TOKEN (a token from `supervisor dashboard new-token` whose digest the fleet file lists)")
        })?,
    };
    let token = token.trim().to_string();
    let mut overrides = Vec::new();
    for at in &reach.at {
        let (name, address) = at
            .split_once('=')
            .filter(|(n, a)| !n.is_empty() && a.contains(':'))
            .ok_or_else(|| bad_input(format!("--at {at}: use NAME=HOST:PORT")))?;
        overrides.push((name.to_string(), address.to_string()));
    }
    Ok((fleet, token, overrides))
}

fn enroll(args: &Reach) -> Result<(), Failure> {
    let (fleet, token, overrides) = reach(args)?;
    let paths = fleet::Paths::beside(&args.fleet);
    let not_enrolled = fleet::enroll_all(&paths, &fleet, &token, &overrides, |line| {
        println!("{line}")
    })
    .map_err(failed)?;
    if not_enrolled > 0 {
        return Err(failed_count(not_enrolled, "not enrolled"));
    }
    // Clusters: each member learns the others' keys once all are enrolled.
    let unlinked = operator::cluster::exchange(&paths, &fleet, &token, &overrides, |line| {
        println!("{line}")
    })
    .map_err(failed)?;
    if unlinked > 0 {
        return Err((1, format!("{unlinked} cluster(s) not linked")));
    }
    Ok(())
}

fn failed_count(n: usize, what: &str) -> Failure {
    (
        1,
        format!("{n} box{} {what}", if n == 1 { "" } else { "es" }),
    )
}

fn status(args: &Reach, json: bool) -> Result<(), Failure> {
    let (fleet, token, overrides) = reach(args)?;
    let lock = fleet::read_lock(&fleet::Paths::beside(&args.fleet)).map_err(bad_input)?;
    let names: Vec<String> = fleet
        .boxes
        .iter()
        .filter_map(|b| b.name.as_ref().map(|n| n.to_string()))
        .collect();
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if !json {
            eprintln!("asking {name} ({} of {})", i + 1, names.len());
        }
        rows.push(fleet::status_one(&fleet, &lock, name, &token, &overrides));
    }
    if json {
        let text = serde_json::to_string_pretty(&rows).map_err(failed)?;
        println!("{text}");
    } else {
        print!("{}", fleet::table(&rows));
    }
    let untrusted = rows.iter().filter(|r| r.identity == "MISMATCH").count();
    if untrusted > 0 {
        return Err(failed_count(untrusted, "not trusted (identity mismatch)"));
    }
    Ok(())
}

fn update(args: &Reach, bundle: &Path, wait: u64) -> Result<(), Failure> {
    let (fleet, token, overrides) = reach(args)?;
    let lock = fleet::read_lock(&fleet::Paths::beside(&args.fleet)).map_err(bad_input)?;
    let bytes =
        std::fs::read(bundle).map_err(|e| bad_input(format!("{}: {e}", bundle.display())))?;
    let names: Vec<String> = fleet
        .boxes
        .iter()
        .filter_map(|b| b.name.as_ref().map(|n| n.to_string()))
        .collect();
    let rollout = fleet::Rollout {
        bundle: &bytes,
        wait: std::time::Duration::from_secs(wait),
        say: &|line| eprintln!("{line}"),
    };
    for (i, name) in names.iter().enumerate() {
        eprintln!("updating {name} ({} of {})", i + 1, names.len());
        match fleet::update_one(&fleet, &lock, name, &token, &overrides, &rollout) {
            Ok(done) => println!("{done}"),
            Err(e) => {
                let left = &names[i + 1..];
                return Err(failed(format!(
                    "{e}; stopped: {} not updated ({})",
                    if left.is_empty() {
                        "no box left".to_string()
                    } else {
                        format!("{} box(es)", left.len())
                    },
                    left.join(", ")
                )));
            }
        }
    }
    println!("all {} boxes updated", names.len());
    Ok(())
}

fn usb(text: &str, key: &Path, dir: &Path) -> Result<(), Failure> {
    let secret =
        std::fs::read_to_string(key).map_err(|e| bad_input(format!("{}: {e}", key.display())))?;
    let signature = weights::sign::sign(text.as_bytes(), &secret)
        .map_err(|e| bad_input(format!("{}: {e}", key.display())))?;
    let file = dir.join(PROVISION_FILE);
    let sig = dir.join(format!("{PROVISION_FILE}.sig"));
    // The signature first: a stick pulled out between the two writes holds an old file with a
    // signature that does not match it, which boxes refuse, never an unsigned new one.
    for (path, contents) in [(&sig, signature.as_str()), (&file, text)] {
        durable::replace(path, contents.as_bytes())
            .map_err(|e| failed(format!("{}: {e}", path.display())))?;
    }
    println!(
        "{} and {} written; boxes that trust this key apply them when the stick is plugged in",
        file.display(),
        sig.display()
    );
    Ok(())
}

fn wifi_psk(ssid: &str) -> Result<(), Failure> {
    let ssid: provision::values::Ssid = ssid.parse().map_err(bad_input)?;
    let mut passphrase = String::new();
    std::io::stdin()
        .read_to_string(&mut passphrase)
        .map_err(|e| bad_input(format!("reading the passphrase from stdin: {e}")))?;
    let passphrase = passphrase.strip_suffix('\n').unwrap_or(&passphrase);
    let psk = provision::wifi::psk(&ssid, passphrase).map_err(bad_input)?;
    println!("{psk}");
    Ok(())
}

fn model(command: ModelCommand) -> Result<(), Failure> {
    use operator::models;
    match command {
        ModelCommand::Manifest {
            file,
            draft,
            template,
            id,
            chunk_size,
            engine,
            out,
        } => {
            let engine = engine.unwrap_or_else(models::engine_binary);
            let made = models::manifest(
                &engine,
                &file,
                draft.as_deref(),
                template.as_deref(),
                id,
                chunk_size,
            )
            .map_err(bad_input)?;
            let fit = &made.fit;
            eprintln!(
                "{} ({}, {} MiB): the engine loads it; at a context of {} it needs {} MiB",
                made.manifest.id,
                fit.architecture,
                fit.file_bytes >> 20,
                fit.context,
                fit.need_bytes >> 20
            );
            for b in &fit.boards {
                eprintln!(
                    "  {:>2} GB board: {}, longest context {}",
                    b.memory_gib,
                    if b.fits { "fits" } else { "does not fit" },
                    b.max_context
                );
            }
            eprintln!(
                "engine settings: {} threads, context {}",
                made.manifest.engine.threads, made.manifest.engine.context
            );
            let text = made.manifest.to_toml().map_err(failed)?;
            match out {
                Some(path) => {
                    durable::replace(&path, text.as_bytes())
                        .map_err(|e| failed(format!("{}: {e}", path.display())))?;
                    println!("{} written", path.display());
                }
                None => print!("{text}"),
            }
            Ok(())
        }
        ModelCommand::Sign { manifest, key } => {
            let sig = weights::author::sign(&manifest, &key).map_err(bad_input)?;
            println!("{} written", sig.display());
            Ok(())
        }
    }
}

/// The boxes a fleet command acts on, in the fleet file's order.
fn chosen(fleet: &FleetFile, boxes: Option<&Boxes>) -> Result<Vec<String>, Failure> {
    let all: Vec<String> = fleet
        .boxes
        .iter()
        .filter_map(|b| b.name.as_ref().map(|n| n.to_string()))
        .collect();
    match boxes.and_then(|b| b.box_name.clone()) {
        Some(name) if all.contains(&name) => Ok(vec![name]),
        Some(name) => Err(bad_input(format!(
            "no box {name} in the fleet file (its boxes: {})",
            all.join(", ")
        ))),
        None => Ok(all),
    }
}

/// Runs `each` on the boxes one at a time, stopping at the first failure.
fn one_at_a_time(
    names: &[String],
    what: &str,
    mut each: impl FnMut(&str) -> Result<String, String>,
) -> Result<(), Failure> {
    for (i, name) in names.iter().enumerate() {
        eprintln!("{what} {name} ({} of {})", i + 1, names.len());
        match each(name) {
            Ok(done) => println!("{done}"),
            Err(e) => {
                let left = &names[i + 1..];
                return Err(failed(if left.is_empty() {
                    e
                } else {
                    format!(
                        "{e}; stopped: {} not touched ({})",
                        left.len(),
                        left.join(", ")
                    )
                }));
            }
        }
    }
    Ok(())
}

fn fleet_model(command: FleetModelCommand) -> Result<(), Failure> {
    use operator::models;
    let connect = |args: &Reach| -> Result<_, Failure> {
        let (fleet, token, overrides) = reach(args)?;
        let lock = fleet::read_lock(&fleet::Paths::beside(&args.fleet)).map_err(bad_input)?;
        Ok((fleet, token, overrides, lock))
    };
    match command {
        FleetModelCommand::Push {
            reach,
            boxes,
            manifest,
            files,
        } => {
            let (fleet, token, overrides, lock) = connect(&reach)?;
            let names = chosen(&fleet, Some(&boxes))?;
            let model = models::signed(&manifest, &files).map_err(bad_input)?;
            one_at_a_time(&names, "pushing to", |name| {
                let to = fleet::connect(&fleet, &lock, name, &overrides)?;
                models::push(&to, &token, &model, &|line| eprintln!("{line}"))
            })
        }
        FleetModelCommand::Use {
            reach,
            boxes,
            id,
            wait,
        } => {
            let (fleet, token, overrides, lock) = connect(&reach)?;
            let names = chosen(&fleet, Some(&boxes))?;
            one_at_a_time(&names, "switching", |name| {
                let on = fleet::connect(&fleet, &lock, name, &overrides)?;
                models::switch(&on, &token, &id, std::time::Duration::from_secs(wait))
            })
        }
        FleetModelCommand::Rm { reach, boxes, id } => {
            let (fleet, token, overrides, lock) = connect(&reach)?;
            let names = chosen(&fleet, Some(&boxes))?;
            one_at_a_time(&names, "removing from", |name| {
                let on = fleet::connect(&fleet, &lock, name, &overrides)?;
                models::remove(&on, &token, &id)
            })
        }
        FleetModelCommand::List { reach, json } => {
            let (fleet, token, overrides, lock) = connect(&reach)?;
            let names = chosen(&fleet, None)?;
            let mut all = serde_json::Map::new();
            let mut unreachable = 0;
            for name in &names {
                let listed = fleet::connect(&fleet, &lock, name, &overrides)
                    .and_then(|on| models::list(&on, &token));
                match listed {
                    Ok(list) if json => {
                        all.insert(name.clone(), serde_json::to_value(&list).map_err(failed)?);
                    }
                    Ok(list) => print!("{}", models::lines(name, &list)),
                    Err(e) => {
                        unreachable += 1;
                        if json {
                            all.insert(name.clone(), serde_json::json!({ "error": e }));
                        } else {
                            println!("{name:16}   {e}");
                        }
                    }
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&all).map_err(failed)?);
            }
            if unreachable > 0 {
                return Err(failed_count(unreachable, "not listed"));
            }
            Ok(())
        }
    }
}
