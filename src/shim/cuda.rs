//! The CUDA driver, runtime and NVML types and codes the shim reads and writes. They
//! come from cudarc's `sys` bindings (CUDA 13.0 headers); what cudarc lacks is
//! mirrored here, each with a comment saying so. Nothing above this module declares a
//! CUDA structure or code of its own.
//!
//! Reading C memory: several structures have fields of a Rust enum type (an array's
//! format, a memory location's type). Reading such a field holding a value the
//! bindings do not list (a newer driver's, or a caller's mistake the driver rejects
//! after us) would be undefined, so those fields are read here as raw integers, and
//! no reference to such a structure is ever formed.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::addr_of;

pub use cudarc::driver::sys::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, CUarray, CUcontext, CUdevice, CUdeviceptr,
    CUgraph, CUgraphNode, CUmemAllocationProp, CUmemGenericAllocationHandle, CUmemPool_attribute,
    CUmemPoolProps, CUmemoryPool, CUmipmappedArray, CUstream, CUuuid,
};
use cudarc::driver::sys::{CUarray_format, CUmemLocation, CUmemLocationType, CUresult};
use cudarc::runtime::sys::cudaError_t;
pub use cudarc::runtime::sys::{cudaExtent, cudaPitchedPtr, cudaStream_t};

// ---- status codes, as the plain integers the C functions return ------------------
// Hooks return what the real function returned, which may be a code the bindings do
// not list: so codes travel as `c_int`, never as cudarc's enums.

/// `CUDA_SUCCESS` (also `cudaSuccess` and `NVML_SUCCESS`: all three are 0).
pub const SUCCESS: c_int = CUresult::CUDA_SUCCESS as c_int;
/// `CUDA_ERROR_OUT_OF_MEMORY`: what a cap refusal answers, a code frameworks handle.
pub const OUT_OF_MEMORY: c_int = CUresult::CUDA_ERROR_OUT_OF_MEMORY as c_int;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const INVALID_VALUE: c_int = CUresult::CUDA_ERROR_INVALID_VALUE as c_int;
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`: a capture ended from a thread other than
/// the one that began it (it goes on).
pub const CAPTURE_WRONG_THREAD: c_int = CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD as c_int;
/// `CUDA_ERROR_NOT_INITIALIZED`: a driver wrapper whose real function is missing.
pub const NOT_INITIALIZED: c_int = CUresult::CUDA_ERROR_NOT_INITIALIZED as c_int;
/// `cudaErrorInitializationError`: the same for a runtime wrapper.
pub const RT_NOT_INITIALIZED: c_int = cudaError_t::cudaErrorInitializationError as c_int;

// ---- NVML: cudarc 0.19 has no NVML bindings, so the little gpuguard uses is here ----

/// `NVML_SUCCESS` (cudarc lacks NVML).
pub const NVML_SUCCESS: c_int = 0;
/// `NVML_ERROR_UNINITIALIZED` (cudarc lacks NVML).
pub const NVML_ERROR_UNINITIALIZED: c_int = 1;
/// `nvmlDevice_t` (cudarc lacks NVML).
pub type NvmlDevice = *mut c_void;

/// `nvmlMemory_t` (cudarc lacks NVML).
#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t` (cudarc lacks NVML).
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `NVML_ERROR_INSUFFICIENT_SIZE` (cudarc lacks NVML).
pub const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;

/// `nvmlProcessInfo_v2_t`, what `nvmlDeviceGetComputeRunningProcesses_v3` fills
/// (cudarc lacks NVML).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

// ---- readers for fields of enum type --------------------------------------------

/// The device a memory location names (`CU_MEM_LOCATION_TYPE_DEVICE`), else `None`.
///
/// # Safety
/// `loc` points to a readable `CUmemLocation`.
unsafe fn location_device(loc: *const CUmemLocation) -> Option<i32> {
    // SAFETY: `type_` is a C enum the caller filled in; read as the raw u32 it is,
    // since a value cudarc's `CUmemLocationType` does not list would be undefined
    // as that Rust enum.
    let (kind, id) = unsafe { (addr_of!((*loc).type_).cast::<u32>().read(), (*loc).id) };
    (kind == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32).then_some(id)
}

/// The device a `cuMemCreate`'s properties name, if a device. NULL: `None`.
///
/// # Safety
/// `prop` is NULL or the caller's structure (the driver rejects bad ones after us).
pub unsafe fn alloc_prop_device(prop: *const CUmemAllocationProp) -> Option<i32> {
    // SAFETY: a field of the caller's structure; no reference to it is formed.
    (!prop.is_null()).then(|| unsafe { location_device(addr_of!((*prop).location)) })?
}

/// The device a `cuMemPoolCreate`'s properties name, if a device. NULL: `None`.
///
/// # Safety
/// As for `alloc_prop_device`.
pub unsafe fn pool_props_device(props: *const CUmemPoolProps) -> Option<i32> {
    // SAFETY: as above.
    (!props.is_null()).then(|| unsafe { location_device(addr_of!((*props).location)) })?
}

/// An array's shape: what its size follows from. The format is `CUarray_format`'s
/// raw value.
#[derive(Clone, Copy)]
pub struct ArrayShape {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub channels: c_uint,
}

impl ArrayShape {
    /// The shape a `cuArrayCreate` descriptor gives. NULL: `None`.
    ///
    /// # Safety
    /// `d` is NULL or points to a readable descriptor.
    pub unsafe fn of_2d(d: *const CUDA_ARRAY_DESCRIPTOR) -> Option<ArrayShape> {
        // SAFETY: fields of the caller's descriptor, by the caller's promise.
        (!d.is_null()).then(|| unsafe {
            let format = addr_of!((*d).Format);
            ArrayShape::read((*d).Width, (*d).Height, 1, format, (*d).NumChannels)
        })
    }

    /// The shape a `cuArray3DCreate` or `cuMipmappedArrayCreate` descriptor gives.
    ///
    /// # Safety
    /// As for `of_2d`.
    pub unsafe fn of_3d(d: *const CUDA_ARRAY3D_DESCRIPTOR) -> Option<ArrayShape> {
        // SAFETY: as in `of_2d`.
        (!d.is_null()).then(|| unsafe {
            let format = addr_of!((*d).Format);
            ArrayShape::read(
                (*d).Width,
                (*d).Height,
                (*d).Depth,
                format,
                (*d).NumChannels,
            )
        })
    }

    /// # Safety
    /// `format` points to a descriptor's `Format` field.
    unsafe fn read(
        width: usize,
        height: usize,
        depth: usize,
        format: *const CUarray_format,
        channels: c_uint,
    ) -> ArrayShape {
        ArrayShape {
            width,
            height,
            depth,
            // SAFETY: the one read of a `CUarray_format` field: as the raw u32 it is,
            // since a value cudarc's Rust enum does not list would be undefined as it.
            format: unsafe { format.cast::<u32>().read() },
            channels,
        }
    }

    /// Bytes the array takes (level 0).
    pub fn bytes(&self) -> u64 {
        self.level_bytes(0)
    }

    /// Bytes of a mipmapped array with `levels` levels, each half the last.
    pub fn mipmapped_bytes(&self, levels: c_uint) -> u64 {
        (0..levels.max(1)).map(|l| self.level_bytes(l)).sum()
    }

    fn level_bytes(&self, l: c_uint) -> u64 {
        ((self.width >> l).max(1) as u64)
            * ((self.height >> l).max(1) as u64)
            * ((self.depth >> l).max(1) as u64)
            * format_bytes(self.format)
            * u64::from(self.channels.max(1))
    }
}

/// Bytes per element of a `CUarray_format`; an estimate for the packed and block
/// formats, whose true footprint the driver does not state.
fn format_bytes(format: u32) -> u64 {
    use CUarray_format::*;
    const U8: u32 = CU_AD_FORMAT_UNSIGNED_INT8 as u32;
    const I8: u32 = CU_AD_FORMAT_SIGNED_INT8 as u32;
    const U16: u32 = CU_AD_FORMAT_UNSIGNED_INT16 as u32;
    const I16: u32 = CU_AD_FORMAT_SIGNED_INT16 as u32;
    const F16: u32 = CU_AD_FORMAT_HALF as u32;
    match format {
        U8 | I8 => 1,
        U16 | I16 | F16 => 2,
        _ => 4, // (UN)SIGNED_INT32, FLOAT, and the estimate for the rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The sizes and offsets of the CUDA 13.0 headers (x86_64), against which the
    /// bindings were generated and the mirrors written.
    #[test]
    fn layouts_match_the_headers() {
        assert_eq!(size_of::<CUdeviceptr>(), 8);
        assert_eq!(size_of::<CUmemGenericAllocationHandle>(), 8);
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(offset_of!(CUDA_ARRAY_DESCRIPTOR, Format), 16);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, Format), 24);
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(offset_of!(CUmemPoolProps, location), 8);
        assert_eq!(size_of::<cudaPitchedPtr>(), 32);
        assert_eq!(size_of::<cudaExtent>(), 24);
        assert_eq!(size_of::<CUuuid>(), 16);
        assert_eq!(size_of::<NvmlMemory>(), 24);
        assert_eq!(size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(offset_of!(NvmlMemoryV2, total), 8);
    }

    #[test]
    fn codes() {
        assert_eq!((SUCCESS, OUT_OF_MEMORY, NOT_INITIALIZED), (0, 2, 3));
        assert_eq!(RT_NOT_INITIALIZED, 3);
        assert_eq!((NVML_SUCCESS, NVML_ERROR_UNINITIALIZED), (0, 1));
    }

    #[test]
    fn enum_fields_read_raw() {
        // A format and a location type no binding lists are read, not trusted.
        // (Words, for the alignment; x86_64 is little-endian.)
        let mut d = [0u64; 5];
        d[0] = 4; // width
        d[1] = 2; // height
        d[3] = (1 << 32) | 0x7777; // format, then channels
        let s = unsafe { ArrayShape::of_3d(d.as_ptr().cast()) }.unwrap();
        assert_eq!((s.format, s.bytes()), (0x7777, 4 * 2 * 4));
        let mut p = [0u64; 4];
        p[1] = 0x55; // location type, then id
        assert_eq!(unsafe { alloc_prop_device(p.as_ptr().cast()) }, None);
        p[1] = (3 << 32) | 1;
        assert_eq!(unsafe { alloc_prop_device(p.as_ptr().cast()) }, Some(3));
    }
}
