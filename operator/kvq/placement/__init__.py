"""kvq.placement"""
