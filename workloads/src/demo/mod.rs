//! The application of `kreplay demo` ([`app`]) and its kernels ([`kernels`]).

pub mod app;
pub mod kernels;
