//! Result layer: one function per HCCL call, returning `Result` with the C function's name in the error.

use core::ffi::c_char;
use std::ptr;

use crate::error::{check, Error};
use crate::sys::*;

/// Communicator bootstrap by root info, queries and teardown. ACL must be initialised and the device set first.
pub mod comm {
    use super::*;

    /// `HcclGetRootInfo`: on rank 0, the root info to share with every rank.
    pub fn get_root_info(api: &HcclApi) -> Result<HcclRootInfo, Error> {
        let mut root = HcclRootInfo::default();
        // SAFETY: a live out-pointer to a struct of the header's layout (checked by the ABI test).
        check("HcclGetRootInfo", unsafe { api.HcclGetRootInfo(&mut root) })?;
        Ok(root)
    }

    /// `HcclCommInitRootInfo`: collective over all `n_ranks` ranks.
    pub fn init_root_info(api: &HcclApi, n_ranks: u32, root: &HcclRootInfo, rank: u32) -> Result<HcclComm, Error> {
        let mut comm = ptr::null_mut();
        // SAFETY: `root` is a live reference, the out-pointer a live local.
        check("HcclCommInitRootInfo", unsafe { api.HcclCommInitRootInfo(n_ranks, root, rank, &mut comm) })?;
        Ok(comm)
    }

    /// `HcclGetRankId`.
    ///
    /// # Safety
    /// `comm` must be a live communicator.
    pub unsafe fn rank_id(api: &HcclApi, comm: HcclComm) -> Result<u32, Error> {
        let mut rank = 0;
        // SAFETY: the caller guarantees the communicator; the out-pointer is a live local.
        check("HcclGetRankId", unsafe { api.HcclGetRankId(comm, &mut rank) })?;
        Ok(rank)
    }

    /// `HcclGetRankSize`.
    ///
    /// # Safety
    /// `comm` must be a live communicator.
    pub unsafe fn rank_size(api: &HcclApi, comm: HcclComm) -> Result<u32, Error> {
        let mut size = 0;
        // SAFETY: the caller guarantees the communicator; the out-pointer is a live local.
        check("HcclGetRankSize", unsafe { api.HcclGetRankSize(comm, &mut size) })?;
        Ok(size)
    }

    /// `HcclGetCommName` (optional symbol).
    ///
    /// # Safety
    /// `comm` must be a live communicator.
    pub unsafe fn name(api: &HcclApi, comm: HcclComm) -> Result<String, Error> {
        let mut name = [0 as c_char; COMM_NAME_MAX_LENGTH as usize];
        // SAFETY: the caller guarantees the communicator; the buffer has the header's maximum name length.
        check("HcclGetCommName", unsafe { api.HcclGetCommName(comm, name.as_mut_ptr())? })?;
        let bytes: Vec<u8> = name.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `HcclCommDestroy`.
    ///
    /// # Safety
    /// `comm` must be live and unused afterwards.
    pub unsafe fn destroy(api: &HcclApi, comm: HcclComm) -> Result<(), Error> {
        // SAFETY: the caller guarantees the communicator.
        check("HcclCommDestroy", unsafe { api.HcclCommDestroy(comm) })
    }
}
