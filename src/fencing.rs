#![doc = include_str!("../docs/fencing.md")]
