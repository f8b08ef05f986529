//! Intrusive doubly linked lists over an arena of entries, linked by 32-bit indices.
//!
//! Every policy keeps its entries in one `Vec` and threads them onto queues through `prev`
//! and `next` indices stored in the entries themselves: no allocation per access, half the
//! memory of pointers, and an entry can sit on two lists at once (LIRS's stack and queue) by
//! carrying two [`Link`]s, told apart by the const parameter `L`.
//!
//! Orientation is the same everywhere: `front` is the oldest end, `back` the newest. Lists
//! never own entries; removing an entry from a list does not free it.

pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub prev: u32,
    pub next: u32,
}

impl Link {
    pub const NONE: Link = Link { prev: NIL, next: NIL };
}

impl Default for Link {
    fn default() -> Self {
        Link::NONE
    }
}

/// An entry that carries link number `L`.
pub(crate) trait Linked<const L: usize> {
    fn link(&self) -> &Link;
    fn link_mut(&mut self) -> &mut Link;
}

/// A bare link array is itself an arena: used for side lists such as LRU's queue, where
/// entry `i`'s links live at index `i` of a separate `Vec<Link>`.
impl Linked<0> for Link {
    #[inline]
    fn link(&self) -> &Link {
        self
    }
    #[inline]
    fn link_mut(&mut self) -> &mut Link {
        self
    }
}

/// Implements [`Linked<0>`] for an entry type whose [`Link`] is its `link` field
/// (`linked_by_field!(generic [Q] Entry<Q>)` for a type generic over `Q`).
macro_rules! linked_by_field {
    ($node:ty) => {
        $crate::list::linked_by_field!(generic [] $node);
    };
    (generic [$($g:ident)?] $node:ty) => {
        impl$(<$g>)? $crate::list::Linked<0> for $node {
            #[inline]
            fn link(&self) -> &$crate::list::Link {
                &self.link
            }
            #[inline]
            fn link_mut(&mut self) -> &mut $crate::list::Link {
                &mut self.link
            }
        }
    };
}
pub(crate) use linked_by_field;

#[derive(Clone, Copy, Debug)]
pub(crate) struct List<const L: usize> {
    head: u32,
    tail: u32,
    len: u32,
}

impl<const L: usize> Default for List<L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const L: usize> List<L> {
    pub const fn new() -> Self {
        List { head: NIL, tail: NIL, len: 0 }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest entry.
    #[inline]
    pub fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    /// The newest entry.
    #[inline]
    pub fn back(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }

    /// The entry after `i` (towards the back).
    #[inline]
    pub fn next<N: Linked<L>>(nodes: &[N], i: u32) -> Option<u32> {
        let n = nodes[i as usize].link().next;
        (n != NIL).then_some(n)
    }

    #[inline]
    pub fn push_back<N: Linked<L>>(&mut self, nodes: &mut [N], i: u32) {
        *nodes[i as usize].link_mut() = Link { prev: self.tail, next: NIL };
        if self.tail != NIL {
            nodes[self.tail as usize].link_mut().next = i;
        } else {
            self.head = i;
        }
        self.tail = i;
        self.len += 1;
    }

    #[inline]
    pub fn push_front<N: Linked<L>>(&mut self, nodes: &mut [N], i: u32) {
        *nodes[i as usize].link_mut() = Link { prev: NIL, next: self.head };
        if self.head != NIL {
            nodes[self.head as usize].link_mut().prev = i;
        } else {
            self.tail = i;
        }
        self.head = i;
        self.len += 1;
    }

    /// Unlink `i`, which must be on this list.
    #[inline]
    pub fn remove<N: Linked<L>>(&mut self, nodes: &mut [N], i: u32) {
        let Link { prev, next } = *nodes[i as usize].link();
        if prev != NIL {
            nodes[prev as usize].link_mut().next = next;
        } else {
            debug_assert_eq!(self.head, i);
            self.head = next;
        }
        if next != NIL {
            nodes[next as usize].link_mut().prev = prev;
        } else {
            debug_assert_eq!(self.tail, i);
            self.tail = prev;
        }
        *nodes[i as usize].link_mut() = Link::NONE;
        debug_assert!(self.len > 0);
        self.len -= 1;
    }

    #[inline]
    pub fn pop_front<N: Linked<L>>(&mut self, nodes: &mut [N]) -> Option<u32> {
        let i = self.front()?;
        self.remove(nodes, i);
        Some(i)
    }

    #[inline]
    pub fn pop_back<N: Linked<L>>(&mut self, nodes: &mut [N]) -> Option<u32> {
        let i = self.back()?;
        self.remove(nodes, i);
        Some(i)
    }

    /// Move `i` (on this list) to the back.
    #[inline]
    pub fn move_to_back<N: Linked<L>>(&mut self, nodes: &mut [N], i: u32) {
        if self.tail != i {
            self.remove(nodes, i);
            self.push_back(nodes, i);
        }
    }

    /// Entries from front (oldest) to back (newest).
    pub fn iter<'a, N: Linked<L>>(&self, nodes: &'a [N]) -> ListIter<'a, N, L> {
        ListIter { nodes, cur: self.head }
    }
}

pub(crate) struct ListIter<'a, N, const L: usize> {
    nodes: &'a [N],
    cur: u32,
}

impl<N: Linked<L>, const L: usize> Iterator for ListIter<'_, N, L> {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        if self.cur == NIL {
            return None;
        }
        let i = self.cur;
        self.cur = self.nodes[i as usize].link().next;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_remove_and_order() {
        let mut nodes = vec![Link::NONE; 5];
        let mut l: List<0> = List::new();
        for i in 0..5 {
            l.push_back(&mut nodes, i);
        }
        l.remove(&mut nodes, 2);
        l.move_to_back(&mut nodes, 0);
        l.push_front(&mut nodes, 2);
        assert_eq!(l.iter(&nodes).collect::<Vec<_>>(), vec![2, 1, 3, 4, 0]);
        let mut nodes = vec![Link::NONE; 4];
        let mut l: List<0> = List::new();
        l.push_back(&mut nodes, 0);
        l.push_back(&mut nodes, 1);
        l.push_front(&mut nodes, 3);
        assert_eq!(l.pop_front(&mut nodes), Some(3));
        assert_eq!(l.pop_back(&mut nodes), Some(1));
        assert_eq!(l.len(), 1);
    }
}
