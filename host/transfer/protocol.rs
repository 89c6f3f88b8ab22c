//! The protocols a request can name, spelt as Mooncake spells them.

use std::fmt;

/// The protocols a request can name. Mooncake spells them in lower case in mooncake.json and descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// AIV direct-drive: an AscendC kernel on the AI Vector cores builds and submits the descriptors.
    Aiv,
    /// One-sided engine through HiXL (ADXL's shape), a baseline: HiXL's client-server mode submits from AI-CPU kernels.
    Adxl,
    /// One-sided engine through HiXL's FabricMem engine (Ascend Direct with FabricMem), a baseline, twin runtime only:
    /// AI-CPU unfold by default (batched SDMA SQEs written by AI-CPU launches), Host unfold on request.
    AdxlFabric,
    /// Host worker and stream pool over exported/imported device memory (Mooncake's UBShmem shape), a baseline.
    Ubshmem,
    /// Mooncake's TCP transport, wire compatible.
    Tcp,
}

/// Protocols Mooncake knows that this engine does not provide; named so the error can say so precisely.
pub const MOONCAKE_ONLY_PROTOCOLS: &[&str] = &[
    "rdma",
    "ascend",
    "hccl",
    "ub",
    "nvlink",
    "nvlink_intra",
    "hip",
    "cxl",
    "efa",
    "nvmeof",
    "barex",
    "ascend_direct",
];

impl Protocol {
    /// Every protocol this engine provides.
    pub const ALL: [Protocol; 5] =
        [Protocol::Aiv, Protocol::Adxl, Protocol::AdxlFabric, Protocol::Ubshmem, Protocol::Tcp];

    /// The lower-case name used in mooncake.json, descriptors and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Aiv => "aiv",
            Protocol::Adxl => "adxl",
            Protocol::AdxlFabric => "adxl-fabric",
            Protocol::Ubshmem => "ubshmem",
            Protocol::Tcp => "tcp",
        }
    }

    /// Whether the data path runs through the Device (device memory on both ends).
    pub fn is_device_path(self) -> bool {
        !matches!(self, Protocol::Tcp)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a protocol name was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolParseError {
    /// Mooncake provides it; this engine does not.
    #[error(
        "protocol {0:?} is a Mooncake protocol that this engine does not provide (it provides aiv, adxl, adxl-fabric, ubshmem, tcp)"
    )]
    MooncakeOnly(String),
    /// Nobody knows it.
    #[error("unknown protocol {0:?} (this engine provides aiv, adxl, adxl-fabric, ubshmem, tcp)")]
    Unknown(String),
}

impl std::str::FromStr for Protocol {
    type Err = ProtocolParseError;

    /// Parses a protocol name case-insensitively, as Mooncake lower-cases it.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let lower = name.trim().to_ascii_lowercase();
        if let Some(protocol) = Protocol::ALL.into_iter().find(|p| p.as_str() == lower) {
            return Ok(protocol);
        }
        if MOONCAKE_ONLY_PROTOCOLS.contains(&lower.as_str()) {
            Err(ProtocolParseError::MooncakeOnly(name.to_owned()))
        } else {
            Err(ProtocolParseError::Unknown(name.to_owned()))
        }
    }
}
