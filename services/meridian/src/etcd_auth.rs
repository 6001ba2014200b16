//! `meridian etcd-auth`: turns etcd's authentication on for a Meridian cluster, or brings it
//! up to date (the chart's bundled etcd runs it as a Job after every install and upgrade).
//!
//! It makes sure of a `root` user (etcd needs one before authentication can be on), a role
//! named after the Meridian user that may read and write `/meridian/` and nothing else, and
//! that user with that role and the given password; then it turns authentication on. Run
//! again, it finds authentication on, logs in as root and sets the same things again.

use anyhow::Context;
use etcd_client::Permission;

use crate::cli::EtcdAuthArgs;

pub fn run(args: EtcdAuthArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let user =
            args.cluster.etcd_access.etcd_user.clone().context("--etcd-user: whom to make")?;
        let password =
            args.cluster.etcd_access.etcd_password.clone().context("MERIDIAN_ETCD_PASSWORD")?;
        let mut plain = args.cluster.etcd_access.etcd(&args.cluster.etcd);
        plain.user = None;
        let mut root = plain.clone();
        root.user = Some(("root".into(), args.root_password.clone()));
        // Logging in as root tells whether authentication is on: etcd refuses to
        // authenticate anyone while it is off.
        let (mut client, enabled) = match meridian_cluster::connect(&root).await {
            Ok(client) => (client, true),
            Err(error) if error.to_string().contains("authentication is not enabled") => {
                let client = meridian_cluster::connect(&plain).await.with_context(|| {
                    format!("connecting to etcd at {}", args.cluster.etcd.join(","))
                })?;
                (client, false)
            }
            Err(error) => {
                return Err(error).with_context(|| {
                    format!("logging in to etcd at {} as root", args.cluster.etcd.join(","))
                })
            }
        };
        if !enabled && client.user_get("root").await.is_err() {
            client.user_add("root", args.root_password.as_str(), None).await?;
            client.user_grant_role("root", "root").await?;
        }
        if client.role_get(user.as_str()).await.is_err() {
            client.role_add(user.as_str()).await?;
        }
        let keys = Permission::read_write("/meridian/").with_prefix();
        client.role_grant_permission(user.as_str(), keys).await?;
        if client.user_get(user.as_str()).await.is_ok() {
            client.user_change_password(user.as_str(), password.as_str()).await?;
        } else {
            client.user_add(user.as_str(), password.as_str(), None).await?;
        }
        client.user_grant_role(user.as_str(), user.as_str()).await?;
        if !enabled {
            client.auth_enable().await.context("turning authentication on")?;
        }
        println!(
            "etcd authentication is on; user {user:?} may read and write /meridian/ only{}",
            if enabled { " (updated)" } else { "" }
        );
        Ok(())
    })
}
