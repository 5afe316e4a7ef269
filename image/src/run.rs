//! Running host tools: argument vectors only (never a shell), the command echoed, its failure
//! reported with what ran.

use std::ffi::OsString;
use std::process::{Command, Stdio};

/// An argument vector from anything path- or string-like.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        vec![$(std::ffi::OsStr::new(&$a).to_os_string()),*]
    };
}

/// Runs `program args...`; an error names the command and its exit status.
pub fn run(program: &str, args: Vec<OsString>) -> Result<(), String> {
    status(Command::new(program).args(args))
}

/// Runs a prepared command, echoing it.
pub fn status(command: &mut Command) -> Result<(), String> {
    let shown = describe(command);
    eprintln!("+ {shown}");
    let status = command
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed ({status})"))
    }
}

/// Runs `program args...` feeding `input` on stdin.
pub fn with_input(program: &str, args: &[&str], input: &str) -> Result<(), String> {
    use std::io::Write;
    let shown = format!("{program} {}", args.join(" "));
    eprintln!("+ {shown} < (script)");
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| format!("{shown}: {e}"))?;
    }
    let status = child.wait().map_err(|e| format!("{shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed ({status})"))
    }
}

/// Whether `program` is on `PATH`.
pub fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

fn describe(command: &Command) -> String {
    let mut parts = vec![command.get_program().to_string_lossy().into_owned()];
    parts.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}
