//! The Raspberry Pi bootloader's own formats: its `key=value` configuration text and the
//! `pieeprom` flash image that carries it. Pure data in, data out: reading them off the board is
//! [`crate::eeprom`]'s job.

pub mod conf;
pub mod image;
