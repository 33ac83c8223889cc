//! `spate user scram set|delete|describe`: SCRAM credentials through
//! AlterUserScramCredentials / DescribeUserScramCredentials. `set` salts and hashes the
//! password here (`spate::client` makes the salt and the PBKDF2 salted password, as
//! Kafka's kafka-configs does) and sends only those; the password comes from
//! `--password` or, without it, the first line of stdin.

use std::io::BufRead;

use clap::{Args, Subcommand};
use serde_json::json;

use super::output::{self, table};
use super::ConnArgs;
use spate::client::Error;
use spate::security::scram::{scram_iterations_min, ScramMechanism};

#[derive(Subcommand)]
pub enum UserCommand {
    /// SCRAM credentials (SCRAM-SHA-256, SCRAM-SHA-512).
    #[command(subcommand)]
    Scram(ScramCommand),
}

#[derive(Subcommand)]
pub enum ScramCommand {
    /// Set a user's credential for a mechanism (replacing one there).
    Set {
        #[command(flatten)]
        user: UserMechanism,
        /// PBKDF2 iterations (Kafka takes 4096 to 16384).
        #[arg(long, default_value_t = scram_iterations_min)]
        iterations: u32,
        /// The password; without it, the first line of stdin.
        #[arg(long)]
        password: Option<String>,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Delete a user's credential for a mechanism.
    Delete {
        #[command(flatten)]
        user: UserMechanism,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// The mechanisms and iterations of users' credentials (every user's with no --user).
    Describe {
        /// A user (repeatable).
        #[arg(long = "user")]
        users: Vec<String>,
        #[command(flatten)]
        conn: ConnArgs,
    },
}

#[derive(Args)]
pub struct UserMechanism {
    /// The user name (the principal User:<name>).
    #[arg(long)]
    user: String,
    /// SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long)]
    mechanism: String,
}

impl UserMechanism {
    fn mechanism(&self) -> Result<ScramMechanism, Error> {
        ScramMechanism::from_name(&self.mechanism.to_ascii_uppercase())
            .ok_or_else(|| Error::Usage(format!("--mechanism {:?}: SCRAM-SHA-256 or SCRAM-SHA-512", self.mechanism)))
    }
}

/// The password: the flag's, or stdin's first line without its line end.
fn password(flag: Option<String>) -> Result<String, Error> {
    if let Some(p) = flag {
        return Ok(p);
    }
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| Error::Usage(format!("reading the password: {e}")))?;
    let line = line.trim_end_matches(['\n', '\r']).to_string();
    if line.is_empty() {
        return Err(Error::Usage("no password: give --password or one line on stdin".into()));
    }
    Ok(line)
}

pub fn run(cmd: UserCommand) -> Result<(), Error> {
    let UserCommand::Scram(cmd) = cmd;
    match cmd {
        ScramCommand::Set { user, iterations, password: flag, conn } => {
            let mechanism = user.mechanism()?;
            let password = password(flag)?;
            let mut client = conn.connect()?;
            client.set_scram_credential(&user.user, mechanism, iterations, password.as_bytes())?;
            done(&conn, "set", &user.user, mechanism);
        }
        ScramCommand::Delete { user, conn } => {
            let mechanism = user.mechanism()?;
            let mut client = conn.connect()?;
            client.delete_scram_credential(&user.user, mechanism)?;
            done(&conn, "deleted", &user.user, mechanism);
        }
        ScramCommand::Describe { users, conn } => {
            let mut client = conn.connect()?;
            let described = client.describe_scram_credentials(&users)?;
            if conn.json {
                let list: Vec<_> = described
                    .iter()
                    .map(|(u, creds)| {
                        let creds: Vec<_> =
                            creds.iter().map(|(m, i)| json!({"mechanism": m.name(), "iterations": i})).collect();
                        json!({"user": u, "credentials": creds})
                    })
                    .collect();
                output::json(&json!({ "users": list }));
            } else {
                let rows: Vec<Vec<String>> = described
                    .iter()
                    .flat_map(|(u, creds)| {
                        creds.iter().map(move |(m, i)| vec![u.clone(), m.to_string(), i.to_string()])
                    })
                    .collect();
                table(&["USER", "MECHANISM", "ITERATIONS"], &rows);
            }
        }
    }
    Ok(())
}

fn done(conn: &ConnArgs, what: &str, user: &str, mechanism: ScramMechanism) {
    if conn.json {
        output::json(&json!({ what: {"user": user, "mechanism": mechanism.name()} }));
    } else {
        output::print_raw(&format!("{what} {mechanism} credential of user {user}\n"));
    }
}
