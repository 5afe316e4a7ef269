//! The bootloader configuration text (`bootconf.txt`), as `rpi-eeprom-config` prints it: `key=value`
//! lines, `#` comments and `[filter]` sections, where `[all]` (or no section yet) applies always.

/// The value an unconditional `key=` line sets, the last one winning as the bootloader reads it
/// (the firmware's format, read as for `config.txt`).
pub fn get<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    config_txt::setting(text, key)
}

/// Returns the text with the unconditional `key` set to `value`, changing nothing else.
///
/// The last unconditional line for the key is rewritten in place; without one, an `[all]` section
/// with the key is appended so no earlier filter can hide it.
pub fn set(text: &str, key: &str, value: &str) -> String {
    let mut unconditional = true;
    let mut last = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(section) = config_txt::section_name(trimmed) {
            unconditional = section.eq_ignore_ascii_case("all");
            continue;
        }
        if unconditional
            && trimmed
                .split_once('=')
                .is_some_and(|(k, _)| k.trim() == key)
        {
            last = Some(index);
        }
    }
    let mut out = String::with_capacity(text.len() + key.len() + value.len() + 8);
    match last {
        Some(target) => {
            for (index, line) in text.lines().enumerate() {
                if index == target {
                    out.push_str(&format!("{key}={value}"));
                } else {
                    out.push_str(line);
                }
                out.push('\n');
            }
        }
        None => {
            out.push_str(text);
            if !text.is_empty() && !text.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("[all]\n{key}={value}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = "[all]\nBOOT_UART=1\nPOWER_OFF_ON_HALT=0\nBOOT_ORDER=0xf461\n";

    #[test]
    fn reads_the_last_unconditional_value_only() {
        let text = "[all]\nSDRAM_BANKLOW=1\n[gpio4=1]\nSDRAM_BANKLOW=4\n[all]\nSDRAM_BANKLOW = 3\n# SDRAM_BANKLOW=0\n";
        assert_eq!(get(text, "SDRAM_BANKLOW"), Some("3"));
        assert_eq!(get("[gpio4=1]\nSDRAM_BANKLOW=4\n", "SDRAM_BANKLOW"), None);
        assert_eq!(get(SHIPPED, "SDRAM_BANKLOW"), None);
        assert_eq!(get(SHIPPED, "BOOT_ORDER"), Some("0xf461"));
    }

    #[test]
    fn setting_a_missing_key_appends_an_all_section() {
        let out = set("[gpio4=1]\nBOOT_UART=0", "SDRAM_BANKLOW", "3");
        assert_eq!(out, "[gpio4=1]\nBOOT_UART=0\n[all]\nSDRAM_BANKLOW=3\n");
        assert_eq!(get(&out, "SDRAM_BANKLOW"), Some("3"));
    }

    #[test]
    fn setting_an_existing_key_rewrites_only_that_line() {
        let text = "[all]\nBOOT_UART=1\nSDRAM_BANKLOW=1\nBOOT_ORDER=0xf461\n";
        let out = set(text, "SDRAM_BANKLOW", "3");
        assert_eq!(
            out,
            "[all]\nBOOT_UART=1\nSDRAM_BANKLOW=3\nBOOT_ORDER=0xf461\n"
        );
    }
}
