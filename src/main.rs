use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    rollgate::cli::run(rollgate::cli::Cli::parse())
}
