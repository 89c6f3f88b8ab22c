//! Safe owners over HCCL handles.

use crate::error::Error;
use crate::result::comm;
use crate::sys::{HcclApi, HcclComm, HcclRootInfo};

/// A communicator destroyed on drop.
#[derive(Debug)]
pub struct Communicator<'api> {
    api: &'api HcclApi,
    raw: HcclComm,
}

impl<'api> Communicator<'api> {
    /// `HcclCommInitRootInfo` (collective).
    pub fn init(api: &'api HcclApi, n_ranks: u32, root: &HcclRootInfo, rank: u32) -> Result<Self, Error> {
        Ok(Self { api, raw: comm::init_root_info(api, n_ranks, root, rank)? })
    }

    /// The raw handle.
    pub fn as_raw(&self) -> HcclComm {
        self.raw
    }

    /// `HcclGetRankId`.
    pub fn rank(&self) -> Result<u32, Error> {
        // SAFETY: `raw` is live until `self` drops.
        unsafe { comm::rank_id(self.api, self.raw) }
    }

    /// `HcclGetRankSize`.
    pub fn size(&self) -> Result<u32, Error> {
        // SAFETY: `raw` is live until `self` drops.
        unsafe { comm::rank_size(self.api, self.raw) }
    }
}

impl Drop for Communicator<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and this is its last use.
        let _ = unsafe { comm::destroy(self.api, self.raw) };
    }
}
