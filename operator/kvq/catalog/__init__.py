"""kvq.catalog"""
