"""Small reusable widgets with no MoEScope concept in them."""
