//! `appliance`, the IT person's tool for a fleet of boxes, as a library under a thin binary.
//!
//! It never needs root to prepare a card: [`stamp`] copies an image and writes a box's
//! provisioning file into the copy's boot partition through a FAT implementation of our own
//! choosing (no mount, no loop device). [`flash`] writes an image to a card and reads it back.
//! [`models`] makes and signs model manifests and pushes, switches and removes models on the
//! fleet's boxes. Fleet files themselves are parsed and checked by the `provision` crate.

pub mod cluster;
pub mod disk;
pub mod flash;
pub mod fleet;
pub mod https;
pub mod models;
pub mod stamp;
