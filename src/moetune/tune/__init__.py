"""`moetune tune`: a budgeted search for the fastest plan, measured launch by launch."""
