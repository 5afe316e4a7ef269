//! `--installed`: the model the supervisor installed, found where it installs it
//! (`DATA/models/<id>/current`, laid out by `weights::install`), so that nobody has to copy a
//! hashed version path to try the box's model.
//!
//! Not verified here: the engine has no trusted keys, and the supervisor's launch gate and
//! `supervisor weights verify --installed` are what prove the weights. The manifest is read only
//! for the file's name.

use std::path::{Path, PathBuf};

use weights::Manifest;
use weights::install::{MANIFEST, current_dir, installed_ids};

pub use weights::install::DEFAULT_DATA_DIR;

/// The weights of model `id` as installed in `data_dir`; without an id, those of the one model
/// installed there.
pub fn resolve(data_dir: &Path, id: Option<&str>) -> Result<PathBuf, String> {
    let id = match id {
        Some(id) => id.to_string(),
        None => only_installed(data_dir)?,
    };
    let version = current_dir(data_dir, &id).map_err(|e| e.to_string())?;
    let manifest_path = version.join(MANIFEST);
    let manifest = Manifest::read_text(&manifest_path)
        .and_then(|text| Manifest::parse(&text, &manifest_path.display().to_string()))
        .map_err(|e| e.to_string())?;
    if manifest.id != id {
        return Err(format!(
            "{} is for model {}, not {id}; reinstall {id} with `supervisor weights install`",
            manifest_path.display(),
            manifest.id
        ));
    }
    Ok(version.join(&manifest.file))
}

fn only_installed(data_dir: &Path) -> Result<String, String> {
    let ids = installed_ids(data_dir).map_err(|e| e.to_string())?;
    match <[String; 1]>::try_from(ids) {
        Ok([id]) => Ok(id),
        Err(ids) if ids.is_empty() => Err(format!(
            "no model is installed in {}: install the default one with \
             `supervisor weights fetch-default` (for a simulated board \
             `supervisor --root BOARD weights fetch-default`, then give \
             `--data BOARD/var/lib/appliance`), or point --data at the data directory that has one",
            data_dir.display()
        )),
        Err(ids) => Err(format!(
            "{} models are installed in {} ({}): name one with `--installed ID`",
            ids.len(),
            data_dir.display(),
            ids.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An installed model as `weights::install` lays it out, without the weights' contents.
    fn install(data: &Path, id: &str, manifest_id: &str) {
        let dir = data.join("models").join(id);
        let version = dir.join("0123456789abcdef-1");
        std::fs::create_dir_all(&version).expect("mkdir");
        std::fs::write(dir.join("current"), "0123456789abcdef-1\n").expect("current");
        let hash = "ab".repeat(32);
        let manifest = format!(
            "id = \"{manifest_id}\"\nname = \"M\"\nfile = \"m.gguf\"\nsize = 4\n\
             sha256 = \"{hash}\"\nchunk_size = 65536\nchunks = [\"{hash}\"]\n\n\
             [engine]\nthreads = 1\ncontext = 64\n"
        );
        std::fs::write(version.join("manifest.toml"), manifest).expect("manifest");
    }

    #[test]
    fn the_installed_model_is_found_by_id_or_as_the_only_one() {
        let data = tempfile::tempdir().expect("tempdir");
        let none = resolve(data.path(), None).expect_err("nothing installed");
        assert!(none.contains("supervisor weights fetch-default"), "{none}");
        let missing = resolve(data.path(), Some("a")).expect_err("a is not installed");
        assert!(missing.contains("fetch-default"), "{missing}");

        install(data.path(), "a", "a");
        let a = data.path().join("models/a/0123456789abcdef-1/m.gguf");
        assert_eq!(resolve(data.path(), None), Ok(a.clone()));
        assert_eq!(resolve(data.path(), Some("a")), Ok(a));

        install(data.path(), "b", "c");
        let two = resolve(data.path(), None).expect_err("two installed");
        assert!(
            two.contains("(a, b)") && two.contains("--installed ID"),
            "{two}"
        );
        let wrong = resolve(data.path(), Some("b")).expect_err("manifest for another model");
        assert!(wrong.contains("is for model c, not b"), "{wrong}");
    }
}
