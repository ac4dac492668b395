//! Listing a node's children a page at a time ([`Children`]). Each page is one read, so a
//! listing of several pages is not a snapshot: children created or deleted while it is read
//! may or may not appear.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::node::Stat;

/// How children are listed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildrenOptions {
    /// Include each child's stat.
    pub with_stats: bool,
    /// Children per page (0: the server's maximum, 10,000).
    pub page_size: u32,
}

/// One child of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Child {
    /// Its name (the last segment of its path).
    pub name: String,
    /// Its stat, when asked for.
    pub stat: Option<Stat>,
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildrenPage {
    /// Children in name order.
    pub children: Vec<Child>,
    /// The parent's stat when the page was read.
    pub parent: Stat,
    /// The revision the page was read at.
    pub revision: u64,
}

/// The children of a node, read page by page in name order.
pub struct Children {
    client: Client,
    path: String,
    options: ChildrenOptions,
    /// The last name listed so far.
    start_after: String,
    done: bool,
}

impl Children {
    /// A listing of `path`'s children; nothing is read until a page is asked for.
    pub(crate) fn new(client: Client, path: String, options: ChildrenOptions) -> Children {
        Children { client, path, options, start_after: String::new(), done: false }
    }

    /// The next page, or `None` after the last.
    pub async fn next_page(&mut self) -> Result<Option<ChildrenPage>> {
        if self.done {
            return Ok(None);
        }
        let (page, more) = self.client.children_page(&self.path, &self.options, &self.start_after).await?;
        match page.children.last() {
            Some(last) if more => {
                if last.name <= self.start_after {
                    return Err(Error::Protocol { message: format!("a page of {}'s children went backwards", self.path) });
                }
                self.start_after = last.name.clone();
            }
            None if more => return Err(Error::Protocol { message: format!("an empty page of {}'s children said more follow", self.path) }),
            _ => self.done = true,
        }
        Ok(Some(page))
    }

    /// Every remaining child, reading all the pages (memory grows with the number of
    /// children; use [`Children::next_page`] for very large listings).
    pub async fn all(mut self) -> Result<Vec<Child>> {
        let mut children = Vec::new();
        while let Some(page) = self.next_page().await? {
            children.extend(page.children);
        }
        Ok(children)
    }
}
