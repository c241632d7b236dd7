//! The few GSS-API (RFC 2743/2744) calls SASL GSSAPI needs, bound by hand to the system's
//! MIT Kerberos library (`libgssapi_krb5`, Debian `libkrb5-dev` to build), with safe
//! wrappers. Every `unsafe` block in the crate's GSSAPI support is in this file.
//!
//! Handles (names, credentials, contexts, buffers) are owned by a Rust value whose `Drop`
//! releases them, so nothing leaks on an error path. Calls that may talk to the KDC
//! ([`Context::step`] on the first token, [`Credential::acquire`]) block: callers run them
//! on a blocking thread.

use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr;

type OmUint32 = u32;

#[repr(C)]
struct OidDesc {
    length: OmUint32,
    elements: *mut c_void,
}

#[repr(C)]
struct OidSetDesc {
    count: usize,
    elements: *mut OidDesc,
}

#[repr(C)]
struct BufferDesc {
    length: usize,
    value: *mut c_void,
}

#[repr(C)]
struct KeyValueElement {
    key: *const c_char,
    value: *const c_char,
}

#[repr(C)]
struct KeyValueSet {
    count: OmUint32,
    elements: *const KeyValueElement,
}

/// Opaque `gss_name_struct`, `gss_cred_id_struct`, `gss_ctx_id_struct`.
#[repr(C)]
struct NameStruct {
    _private: [u8; 0],
}
#[repr(C)]
struct CredStruct {
    _private: [u8; 0],
}
#[repr(C)]
struct CtxStruct {
    _private: [u8; 0],
}

#[link(name = "gssapi_krb5")]
extern "C" {
    fn gss_import_name(
        minor: *mut OmUint32,
        input_name: *mut BufferDesc,
        name_type: *mut OidDesc,
        output_name: *mut *mut NameStruct,
    ) -> OmUint32;
    fn gss_display_name(
        minor: *mut OmUint32,
        name: *mut NameStruct,
        output: *mut BufferDesc,
        output_type: *mut *mut OidDesc,
    ) -> OmUint32;
    fn gss_release_name(minor: *mut OmUint32, name: *mut *mut NameStruct) -> OmUint32;
    fn gss_acquire_cred_from(
        minor: *mut OmUint32,
        desired_name: *mut NameStruct,
        time_req: OmUint32,
        desired_mechs: *mut OidSetDesc,
        cred_usage: c_int,
        cred_store: *const KeyValueSet,
        output_cred: *mut *mut CredStruct,
        actual_mechs: *mut *mut OidSetDesc,
        time_rec: *mut OmUint32,
    ) -> OmUint32;
    fn gss_inquire_cred(
        minor: *mut OmUint32,
        cred: *mut CredStruct,
        name: *mut *mut NameStruct,
        lifetime: *mut OmUint32,
        cred_usage: *mut c_int,
        mechanisms: *mut *mut OidSetDesc,
    ) -> OmUint32;
    fn gss_release_cred(minor: *mut OmUint32, cred: *mut *mut CredStruct) -> OmUint32;
    fn gss_init_sec_context(
        minor: *mut OmUint32,
        cred: *mut CredStruct,
        context: *mut *mut CtxStruct,
        target_name: *mut NameStruct,
        mech_type: *mut OidDesc,
        req_flags: OmUint32,
        time_req: OmUint32,
        channel_bindings: *mut c_void,
        input_token: *mut BufferDesc,
        actual_mech_type: *mut *mut OidDesc,
        output_token: *mut BufferDesc,
        ret_flags: *mut OmUint32,
        time_rec: *mut OmUint32,
    ) -> OmUint32;
    fn gss_delete_sec_context(
        minor: *mut OmUint32,
        context: *mut *mut CtxStruct,
        output_token: *mut BufferDesc,
    ) -> OmUint32;
    fn gss_wrap(
        minor: *mut OmUint32,
        context: *mut CtxStruct,
        conf_req: c_int,
        qop_req: OmUint32,
        input: *mut BufferDesc,
        conf_state: *mut c_int,
        output: *mut BufferDesc,
    ) -> OmUint32;
    fn gss_unwrap(
        minor: *mut OmUint32,
        context: *mut CtxStruct,
        input: *mut BufferDesc,
        output: *mut BufferDesc,
        conf_state: *mut c_int,
        qop_state: *mut OmUint32,
    ) -> OmUint32;
    fn gss_display_status(
        minor: *mut OmUint32,
        status: OmUint32,
        status_type: c_int,
        mech_type: *mut OidDesc,
        message_context: *mut OmUint32,
        status_string: *mut BufferDesc,
    ) -> OmUint32;
    fn gss_release_buffer(minor: *mut OmUint32, buffer: *mut BufferDesc) -> OmUint32;
}

const GSS_S_COMPLETE: OmUint32 = 0;
const GSS_S_CONTINUE_NEEDED: OmUint32 = 1;
/// Calling and routine errors (RFC 2744 `GSS_ERROR`); the low 16 bits are informatory.
const GSS_ERROR_MASK: OmUint32 = 0xffff_0000;
const GSS_C_GSS_CODE: c_int = 1;
const GSS_C_MECH_CODE: c_int = 2;
const GSS_C_INITIATE: c_int = 1;
const GSS_C_INDEFINITE: OmUint32 = 0xffff_ffff;
const GSS_C_MUTUAL_FLAG: OmUint32 = 2;
const GSS_C_CONF_FLAG: OmUint32 = 16;
const GSS_C_INTEG_FLAG: OmUint32 = 32;

/// 1.2.840.113554.1.2.2: the Kerberos V5 mechanism (RFC 1964).
const KRB5_MECH: &[u8] = b"\x2a\x86\x48\x86\xf7\x12\x01\x02\x02";
/// 1.2.840.113554.1.2.2.1: a Kerberos principal name (`GSS_KRB5_NT_PRINCIPAL_NAME`).
const KRB5_PRINCIPAL_NAME: &[u8] = b"\x2a\x86\x48\x86\xf7\x12\x01\x02\x02\x01";
/// 1.2.840.113554.1.2.1.4: `service@host` (`GSS_C_NT_HOSTBASED_SERVICE`).
const HOSTBASED_SERVICE: &[u8] = b"\x2a\x86\x48\x86\xf7\x12\x01\x02\x01\x04";

/// An OID descriptor pointing at a constant; GSS-API takes `gss_OID` (non-const) but
/// only reads it.
fn oid(bytes: &'static [u8]) -> OidDesc {
    OidDesc {
        length: bytes.len() as OmUint32,
        elements: bytes.as_ptr() as *mut c_void,
    }
}

/// A borrowed input buffer; GSS-API reads it and never writes through it.
fn input(bytes: &[u8]) -> BufferDesc {
    BufferDesc {
        length: bytes.len(),
        value: bytes.as_ptr() as *mut c_void,
    }
}

/// A buffer the library allocates (an output token, a message), released on drop.
struct OwnedBuffer(BufferDesc);

impl OwnedBuffer {
    fn empty() -> Self {
        OwnedBuffer(BufferDesc {
            length: 0,
            value: ptr::null_mut(),
        })
    }

    fn to_vec(&self) -> Vec<u8> {
        if self.0.value.is_null() || self.0.length == 0 {
            return Vec::new();
        }
        // SAFETY: the library filled `value` with `length` initialised bytes that stay
        // allocated until `gss_release_buffer` in `drop`.
        unsafe { std::slice::from_raw_parts(self.0.value as *const u8, self.0.length) }.to_vec()
    }
}

impl Drop for OwnedBuffer {
    fn drop(&mut self) {
        if !self.0.value.is_null() {
            let mut minor = 0;
            // SAFETY: `value` was allocated by the library (or is null, checked above);
            // release frees it and nulls the descriptor, so it is released once.
            unsafe { gss_release_buffer(&mut minor, &mut self.0) };
        }
    }
}

/// A GSS-API failure: the major and minor status as the library words them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GssError {
    /// The routine error (`GSS_S_*`), e.g. "Unspecified GSS failure.  Minor code may
    /// provide more information".
    pub(crate) major: String,
    /// The Kerberos error, e.g. "Client 'x@R' not found in Kerberos database".
    pub(crate) minor: String,
}

impl std::fmt::Display for GssError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.minor.is_empty() {
            f.write_str(&self.major)
        } else {
            write!(f, "{} ({})", self.minor, self.major)
        }
    }
}

fn status_text(code: OmUint32, kind: c_int) -> String {
    let mut parts = Vec::new();
    let mut context: OmUint32 = 0;
    let mut mech = oid(KRB5_MECH);
    for _ in 0..8 {
        let mut minor = 0;
        let mut buf = OwnedBuffer::empty();
        // SAFETY: all pointers are to live locals; the library allocates `buf`, which
        // OwnedBuffer releases.
        let major = unsafe {
            gss_display_status(&mut minor, code, kind, &mut mech, &mut context, &mut buf.0)
        };
        if major & GSS_ERROR_MASK != 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf.to_vec()).trim().to_string();
        if !text.is_empty() {
            parts.push(text);
        }
        if context == 0 {
            break;
        }
    }
    parts.join("; ")
}

fn check(major: OmUint32, minor: OmUint32) -> Result<OmUint32, GssError> {
    if major & GSS_ERROR_MASK == 0 {
        return Ok(major);
    }
    Err(GssError {
        major: status_text(major & GSS_ERROR_MASK, GSS_C_GSS_CODE),
        minor: if minor == 0 {
            String::new()
        } else {
            status_text(minor, GSS_C_MECH_CODE)
        },
    })
}

fn plain_error(text: &str) -> GssError {
    GssError {
        major: text.to_string(),
        minor: String::new(),
    }
}

/// An imported name (`gss_name_t`).
pub(crate) struct Name(*mut NameStruct);

// SAFETY: a name is an immutable value once imported; MIT's library keeps no thread
// affinity for it, and `Name` only ever passes it to calls that read it.
unsafe impl Send for Name {}
// SAFETY: as above: shared use is read-only.
unsafe impl Sync for Name {}

impl Name {
    fn import(text: &str, kind: &'static [u8]) -> Result<Name, GssError> {
        let mut buf = input(text.as_bytes());
        let mut name_type = oid(kind);
        let mut out = ptr::null_mut();
        let mut minor = 0;
        // SAFETY: `buf` borrows `text` for the call only (the library copies it); the OID
        // points at a static; `out` receives a new name owned by the returned `Name`.
        let major = unsafe { gss_import_name(&mut minor, &mut buf, &mut name_type, &mut out) };
        check(major, minor)?;
        if out.is_null() {
            return Err(plain_error("gss_import_name returned no name"));
        }
        Ok(Name(out))
    }

    /// A Kerberos principal such as `client@EXAMPLE.COM` (`GSS_KRB5_NT_PRINCIPAL_NAME`).
    pub(crate) fn principal(text: &str) -> Result<Name, GssError> {
        Name::import(text, KRB5_PRINCIPAL_NAME)
    }

    /// A host-based service `service@host` (`GSS_C_NT_HOSTBASED_SERVICE`), which the
    /// library turns into the principal `service/host@REALM`.
    pub(crate) fn host_service(service: &str, host: &str) -> Result<Name, GssError> {
        Name::import(&format!("{service}@{host}"), HOSTBASED_SERVICE)
    }

    /// The name as text.
    pub(crate) fn display(&self) -> String {
        let mut minor = 0;
        let mut buf = OwnedBuffer::empty();
        let mut name_type = ptr::null_mut();
        // SAFETY: `self.0` is a live name; `buf` is released by OwnedBuffer; the returned
        // type OID points into static library storage and is not freed.
        let major = unsafe { gss_display_name(&mut minor, self.0, &mut buf.0, &mut name_type) };
        if check(major, minor).is_err() {
            return "<unprintable name>".to_string();
        }
        String::from_utf8_lossy(&buf.to_vec()).into_owned()
    }
}

impl Drop for Name {
    fn drop(&mut self) {
        let mut minor = 0;
        // SAFETY: `self.0` was returned by the library and is released exactly once here.
        unsafe { gss_release_name(&mut minor, &mut self.0) };
    }
}

/// Initiator credentials (`gss_cred_id_t`).
pub(crate) struct Credential(*mut CredStruct);

// SAFETY: MIT's krb5 mechanism guards each credential with its own mutex
// (`krb5_gss_cred_id_rec.lock`, taken by every call that uses or refreshes it), so one
// credential may be used from several threads at once, as `Gssapi` does for its
// connections.
unsafe impl Send for Credential {}
// SAFETY: as above.
unsafe impl Sync for Credential {}

impl Credential {
    /// Credentials for `principal` (the default principal when `None`), taken from
    /// `keytab` when given — tickets then live in a private in-memory cache named
    /// `memory_ccache` and are renewed from the keytab by the library — else from the
    /// default ticket cache (or the client keytab `KRB5_CLIENT_KTNAME`). May contact the
    /// KDC: call it on a blocking thread.
    pub(crate) fn acquire(
        principal: Option<&Name>,
        keytab: Option<&str>,
        memory_ccache: &str,
    ) -> Result<Credential, GssError> {
        let mut mech = oid(KRB5_MECH);
        let mut mechs = OidSetDesc {
            count: 1,
            elements: &mut mech,
        };
        let keytab = keytab
            .map(|k| CString::new(k).map_err(|_| plain_error("keytab path contains NUL")))
            .transpose()?;
        let ccache =
            CString::new(memory_ccache).map_err(|_| plain_error("ccache name contains NUL"))?;
        let client_keytab = c"client_keytab";
        let ccache_key = c"ccache";
        let elements = keytab.as_ref().map(|k| {
            [
                KeyValueElement {
                    key: client_keytab.as_ptr(),
                    value: k.as_ptr(),
                },
                KeyValueElement {
                    key: ccache_key.as_ptr(),
                    value: ccache.as_ptr(),
                },
            ]
        });
        let store = elements.as_ref().map(|e| KeyValueSet {
            count: e.len() as OmUint32,
            elements: e.as_ptr(),
        });
        let store_ptr = store
            .as_ref()
            .map_or(ptr::null(), |s| s as *const KeyValueSet);
        let name_ptr = principal.map_or(ptr::null_mut(), |n| n.0);
        let mut out = ptr::null_mut();
        let mut minor = 0;
        // SAFETY: every pointer is to a live local (the store's strings outlive the call)
        // or a live `Name`; a null store or name means "defaults" (RFC 2744, MIT's
        // gss_acquire_cred_from); `out` receives a credential owned by the result.
        let major = unsafe {
            gss_acquire_cred_from(
                &mut minor,
                name_ptr,
                GSS_C_INDEFINITE,
                &mut mechs,
                GSS_C_INITIATE,
                store_ptr,
                &mut out,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        check(major, minor)?;
        if out.is_null() {
            return Err(plain_error("gss_acquire_cred_from returned no credential"));
        }
        Ok(Credential(out))
    }

    /// The principal these credentials are for, if the library can say.
    pub(crate) fn principal(&self) -> Option<String> {
        let mut minor = 0;
        let mut name = ptr::null_mut();
        // SAFETY: `self.0` is a live credential; `name` receives a new name that the
        // `Name` below releases; the other outputs are not requested (null).
        let major = unsafe {
            gss_inquire_cred(
                &mut minor,
                self.0,
                &mut name,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        if check(major, minor).is_err() || name.is_null() {
            return None;
        }
        Some(Name(name).display())
    }
}

impl Drop for Credential {
    fn drop(&mut self) {
        let mut minor = 0;
        // SAFETY: `self.0` was returned by the library and is released exactly once here.
        unsafe { gss_release_cred(&mut minor, &mut self.0) };
    }
}

/// An initiator security context (`gss_ctx_id_t`), Kerberos V5, with mutual
/// authentication, integrity and confidentiality requested (as the Java client's
/// `GssKrb5Client`).
pub(crate) struct Context {
    handle: *mut CtxStruct,
    target: Name,
    established: bool,
}

// SAFETY: a context has no thread affinity in MIT's library; `Context` is used through
// `&mut self` only, so never from two threads at once.
unsafe impl Send for Context {}

/// What [`Context::step`] produced.
pub(crate) struct Step {
    /// The token to send (may be empty).
    pub(crate) token: Vec<u8>,
    /// The context is established.
    pub(crate) complete: bool,
}

impl Context {
    /// A context for `target`, not started yet.
    pub(crate) fn new(target: Name) -> Context {
        Context {
            handle: ptr::null_mut(),
            target,
            established: false,
        }
    }

    /// The target principal as text.
    pub(crate) fn target(&self) -> String {
        self.target.display()
    }

    /// One `gss_init_sec_context` call: `input` is empty on the first. The first call
    /// obtains a service ticket (from the KDC unless cached): run it on a blocking thread.
    pub(crate) fn step(
        &mut self,
        cred: Option<&Credential>,
        input_token: &[u8],
    ) -> Result<Step, GssError> {
        let mut mech = oid(KRB5_MECH);
        let mut inbuf = input(input_token);
        let in_ptr: *mut BufferDesc = if input_token.is_empty() {
            ptr::null_mut()
        } else {
            &mut inbuf
        };
        let mut out = OwnedBuffer::empty();
        let mut minor = 0;
        let cred_ptr = cred.map_or(ptr::null_mut(), |c| c.0);
        // SAFETY: `self.handle` is null (new context) or a context this library created;
        // the target name and credential are live; `inbuf` borrows `input_token` for the
        // call; `out` is released by OwnedBuffer; optional outputs are null.
        let major = unsafe {
            gss_init_sec_context(
                &mut minor,
                cred_ptr,
                &mut self.handle,
                self.target.0,
                &mut mech,
                GSS_C_MUTUAL_FLAG | GSS_C_INTEG_FLAG | GSS_C_CONF_FLAG,
                0,
                ptr::null_mut(),
                in_ptr,
                ptr::null_mut(),
                &mut out.0,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        let major = check(major, minor)?;
        // Past `check` only supplementary bits remain: CONTINUE_NEEDED or COMPLETE.
        let complete = major & GSS_S_CONTINUE_NEEDED == GSS_S_COMPLETE;
        self.established = complete;
        Ok(Step {
            token: out.to_vec(),
            complete,
        })
    }

    /// `gss_unwrap`: verify (and decrypt) a message from the server.
    pub(crate) fn unwrap(&mut self, message: &[u8]) -> Result<Vec<u8>, GssError> {
        if !self.established {
            return Err(plain_error("security context not established"));
        }
        let mut inbuf = input(message);
        let mut out = OwnedBuffer::empty();
        let mut minor = 0;
        // SAFETY: the context is established and live; `inbuf` borrows `message` for the
        // call; `out` is released by OwnedBuffer; conf/qop outputs are not requested.
        let major = unsafe {
            gss_unwrap(
                &mut minor,
                self.handle,
                &mut inbuf,
                &mut out.0,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        check(major, minor)?;
        Ok(out.to_vec())
    }

    /// `gss_wrap` with integrity only (no confidentiality): the RFC 4752 final message.
    pub(crate) fn wrap(&mut self, message: &[u8]) -> Result<Vec<u8>, GssError> {
        if !self.established {
            return Err(plain_error("security context not established"));
        }
        let mut inbuf = input(message);
        let mut out = OwnedBuffer::empty();
        let mut minor = 0;
        // SAFETY: as in `unwrap`; conf_req 0 asks for integrity protection only.
        let major = unsafe {
            gss_wrap(
                &mut minor,
                self.handle,
                0,
                0,
                &mut inbuf,
                ptr::null_mut(),
                &mut out.0,
            )
        };
        check(major, minor)?;
        Ok(out.to_vec())
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            let mut minor = 0;
            // SAFETY: the handle was created by gss_init_sec_context and is deleted once;
            // no output token is requested.
            unsafe { gss_delete_sec_context(&mut minor, &mut self.handle, ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_import_and_display() {
        let n = Name::host_service("kafka", "broker1.example.com").unwrap();
        assert_eq!(n.display(), "kafka@broker1.example.com");
        let p = Name::principal("alice@EXAMPLE.COM").unwrap();
        assert_eq!(p.display(), "alice@EXAMPLE.COM");
    }

    #[test]
    fn status_text_names_the_error() {
        // GSS_S_BAD_NAME (routine error 2 << 16).
        let text = status_text(2 << 16, GSS_C_GSS_CODE);
        assert!(text.to_lowercase().contains("name"), "{text}");
    }

    #[test]
    fn wrap_before_establishment_is_an_error() {
        let mut c = Context::new(Name::host_service("kafka", "h").unwrap());
        assert!(c.wrap(b"x").is_err());
        assert!(c.unwrap(b"x").is_err());
    }
}
